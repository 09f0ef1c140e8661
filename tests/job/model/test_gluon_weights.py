"""use_pretrained_model=1 at depths 18 and 34: MXNet Gluon's model zoo ResNets (resnet18_v1,
resnet34_v1), converted to the Keras ResNets built here (model/gluon_weights.py), checked against
Gluon itself. MXNet 1.9.1, in a virtualenv of its own (.venv-mxnet), builds each network with random
weights and random BatchNorm statistics, saves it in both of Gluon's name forms, and computes its
pooled features and logits (tests/job/model/gluon_reference.py); the file is converted by the command
a user types (`python -m keras_pipe_train.model --import-gluon FILE`), and the Keras backbone,
built by the job's own code with weights=imagenet from [0, 255] images through its own input scaling,
must give the same features and logits. One depth is checked at an odd image size, where padding
and stride placement would show."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tests.conftest import REPO, mxnet_python, run_logged

REFERENCE = REPO / "tests/job/model/gluon_reference.py"


@pytest.fixture(scope="module", params=[(18, 57), (34, 64)], ids=["resnet18", "resnet34"])
def gluon(request, tmp_path_factory):
    """(depth, image size, folder holding Gluon's .params files and the reference .npz)."""
    depth, size = request.param
    folder = tmp_path_factory.mktemp(f"gluon{depth}")
    made = run_logged([str(mxnet_python()), str(REFERENCE), str(depth), str(size), str(folder)], 240)
    assert made.returncode == 0, made.stderr[-3000:]
    return depth, size, folder


def weights_command(*arguments: str, keras_home, **env: str):
    """`python -m keras_pipe_train.model ARGUMENTS`, as a user types it, with KERAS_HOME (and `env`) set."""
    return run_logged([sys.executable, "-m", "keras_pipe_train.model", *arguments], 240,
                      env={**os.environ, "KERAS_HOME": str(keras_home), **env})


def imported(params, keras_home) -> str:
    done = weights_command("--import-gluon", str(params), keras_home=keras_home)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("form", ["", "_legacy"], ids=["save_parameters names", "model zoo names"])
def test_the_converted_resnet_gives_gluons_features_and_logits(gluon, form, tmp_path, monkeypatch):
    import keras

    from keras_pipe_train.model import gluon_weights, mxnet_params
    from keras_pipe_train.model.classifier import build_backbone, input_scaling

    depth, size, folder = gluon
    params = folder / f"resnet{depth}_v1{form}.params"
    said = imported(params, tmp_path)
    assert f"a resnet{depth}_v1 network but not the model zoo's ImageNet file" in said, said
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert gluon_weights.weights_path(f"resnet{depth}").is_file()
    reference = np.load(folder / f"resnet{depth}_v1.npz")
    backbone = build_backbone(f"resnet{depth}", size, "imagenet")
    scaled = input_scaling(f"resnet{depth}")(reference["images"])
    features = keras.layers.GlobalAveragePooling2D()(backbone(scaled)).numpy()
    kernel, bias = gluon_weights.keras_weights(mxnet_params.load(params), str(params))[1]["classifier"]
    logits = features @ kernel + bias
    assert np.abs(reference["features"]).max() > 0.1  # (not a network of zeros)
    np.testing.assert_allclose(features, reference["features"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits, reference["logits"], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_mxnet_params_reads_every_array_and_name_as_mxnet_saved_them(gluon):
    from keras_pipe_train.model import mxnet_params

    depth, _, folder = gluon
    arrays = mxnet_params.load(folder / f"resnet{depth}_v1.params")
    legacy = mxnet_params.load(folder / f"resnet{depth}_v1_legacy.params")
    assert list(arrays)[:2] == ["features.0.weight", "features.1.gamma"] and "output.bias" in arrays
    assert list(legacy)[:2] == ["conv0_weight", "batchnorm0_gamma"] and "dense0_bias" in legacy
    assert [a.shape for a in arrays.values()] == [a.shape for a in legacy.values()]
    assert all(np.array_equal(a, b) for a, b in zip(arrays.values(), legacy.values()))
    assert arrays["features.0.weight"].shape == (64, 3, 7, 7) and arrays["output.weight"].shape == (1000, 512)


@pytest.mark.slow
def test_a_truncated_or_foreign_file_is_refused_naming_it(gluon, tmp_path):
    depth, _, folder = gluon
    whole = (folder / f"resnet{depth}_v1.params").read_bytes()
    cut = tmp_path / "cut.params"
    cut.write_bytes(whole[:len(whole) // 2])
    foreign = tmp_path / "photo.params"
    foreign.write_bytes(b"\xff\xd8\xff\xe0" + bytes(100))
    for path, words in ((cut, "truncated"), (foreign, "is not an MXNet .params file")):
        done = weights_command("--import-gluon", str(path), keras_home=tmp_path / "home")
        assert done.returncode != 0 and str(path) in done.stderr and words in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "models").exists() or not any((tmp_path / "home" / "models").iterdir())


def test_weights_imagenet_without_the_converted_file_says_how_to_bring_it(tmp_path, monkeypatch):
    from keras_pipe_train.model.classifier import build_backbone
    from keras_pipe_train.settings.errors import UserError

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(UserError) as raised:
        build_backbone("resnet34", 64, "imagenet")
    for words in ("BAKE_WEIGHTS=resnet34", "--import-gluon resnet34_v1-48216ba9.params", str(tmp_path)):
        assert words in str(raised.value)


@pytest.mark.slow
def test_bake_weights_downloads_gluons_file_and_refuses_one_that_is_not_the_pinned_file(gluon, tmp_path):
    """BAKE_WEIGHTS=resnet18's download (`--download-imagenet`), from a model zoo mirror on 127.0.0.1
    (MXNET_GLUON_REPO, as MXNet names one): the zip holds a ResNet of the right name but not the
    model zoo's ImageNet file, so its SHA-1 is refused and nothing is left in $KERAS_HOME; a mirror
    without the file is an error naming the URL and the offline way round."""
    import functools
    import http.server
    import threading
    import zipfile

    from keras_pipe_train.model import gluon_weights

    depth, _, folder = gluon
    backbone = f"resnet{depth}"
    models = tmp_path / "mirror" / "gluon" / "models"
    models.mkdir(parents=True)
    name = gluon_weights.gluon_file(backbone)
    with zipfile.ZipFile(models / name.replace(".params", ".zip"), "w") as archive:
        archive.write(folder / f"resnet{depth}_v1.params", name)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "mirror"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        home = tmp_path / "home"
        for repo, words in ((f"http://127.0.0.1:{server.server_port}", "not the pinned"),
                            (f"http://127.0.0.1:{server.server_port}/elsewhere/", "--import-gluon " + name)):
            done = weights_command("--download-imagenet", backbone, keras_home=home, MXNET_GLUON_REPO=repo)
            assert done.returncode != 0 and words in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
            assert not (home / "models").exists() or not any((home / "models").iterdir())
    finally:
        server.shutdown()


def test_mxnet_params_reads_empty_and_scalar_arrays_of_each_format_version(tmp_path):
    """Written byte by byte as NDArray::Save writes them: a V3 (numpy-shaped) scalar, whose ndim 0
    still has a device, a dtype and one value; an empty V2 array and an empty V1 one (ndim 0),
    which end at their shape; a pre-V1 array (no magic, uint32 dimensions). Each array after them
    must read whole."""
    import struct

    from keras_pipe_train.model import mxnet_params

    def array(magic, dims, values, dim_format="q"):
        head = b"" if magic is None else struct.pack("<I", magic)
        head += struct.pack("<i", 0) if magic in (0xF993FAC9, 0xF993FACA) else b""
        head += struct.pack("<i" if magic is not None and magic != 0xF993FAC8 else "<I", len(dims))
        head += struct.pack(f"<{len(dims)}{dim_format}", *dims)
        if values is None:
            return head
        return head + struct.pack("<iii", 1, 0, 0) + np.asarray(values, "<f4").tobytes()

    arrays = [array(0xF993FACA, (), [2.5]), array(0xF993FAC9, (), None), array(0xF993FAC8, (), None),
              array(None, (2,), [1, 2], "I"), array(0xF993FAC9, (3,), [4, 5, 6])]
    names = ["scalar", "empty2", "empty1", "old", "last"]
    data = struct.pack("<QQQ", 0x112, 0, len(arrays)) + b"".join(arrays) + struct.pack("<Q", len(names))
    data += b"".join(struct.pack("<Q", len(n)) + n.encode() for n in names)
    path = tmp_path / "versions.params"
    path.write_bytes(data)
    loaded = mxnet_params.load(path)
    assert list(loaded) == names
    assert loaded["scalar"].shape == () and float(loaded["scalar"]) == 2.5
    assert loaded["empty2"].size == 0 and loaded["empty1"].size == 0
    assert loaded["old"].tolist() == [1, 2] and loaded["last"].tolist() == [4, 5, 6]
    path.write_bytes(data[:-3])
    with pytest.raises(mxnet_params.ParamsError, match="truncated"):
        mxnet_params.load(path)
