"""How many workers `serve` starts, and with how many TensorFlow threads: from the cores, the GPUs
and the container's memory limit (read from cgroup v2 and v1: tests/serve/test_sizing.py; a container
run with --memory shows the same in tests/image/test_container.py)."""

import pytest
from keras_pipe_serve.server import gpu_slot
from keras_pipe_serve.sizing import RUNNER_MB, WORKER_MB, gpus, plan

MB = 2**20


def test_gpus_are_counted_from_their_device_nodes(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert gpus(tmp_path) == 2


@pytest.mark.parametrize("cpus, gpus_, memory_mb, asked, expected, said", [
    # (workers, threads calling the model in each, TensorFlow's intra-op and inter-op threads)
    (2, 0, None, None, (1, 2, 1, 2), "no GPU: one worker, calling its model from a thread per core, 2; no memory limit"),
    (16, 0, None, None, (1, 16, 1, 16), "a thread per core, 16"),
    # a small serverless endpoint: one worker still, and said not to fit
    (2, 0, 1000, None, (1, 2, 1, 2), "warning: the memory limit, 1000 MB, holds 0 at about 1120 MB each; one started"),
    (2, 0, 2048, None, (1, 2, 1, 2), "the memory limit, 2048 MB, holds 1 at about 1120 MB each"),
    (8, 4, None, None, (4, 1, 2, 2), "4 GPU(s): one worker each"),
    (8, 4, 1500, None, (2, 1, 4, 4), "the memory limit, 1500 MB, holds 2 at about 720 MB each"),
    # asked for: started as asked, the cores shared, and a limit too small for it said
    (4, 0, None, 2, (2, 2, 1, 2), "SAGEMAKER_MODEL_SERVER_WORKERS=2; no memory limit"),
    (2, 0, 1000, 2, (2, 1, 1, 1), "SAGEMAKER_MODEL_SERVER_WORKERS=2; warning: the memory limit, 1000 MB, holds 1"),
])
def test_workers_and_threads_come_from_the_cores_the_gpus_and_the_memory_limit(cpus, gpus_, memory_mb, asked,
                                                                                expected, said):
    model = 10 * MB  # (a SavedModel of 10 MB: twice that counted in each worker)
    assert (WORKER_MB, RUNNER_MB) == (700, 400)
    chosen = plan(cpus, gpus_, memory_mb and memory_mb * MB, model, asked)
    assert (chosen.workers, chosen.runners, chosen.intra, chosen.inter) == expected
    assert said in "; ".join(chosen.why)


def test_tensorflows_own_thread_settings_win():
    chosen = plan(8, 0, None, 0, intra=4)
    assert (chosen.workers, chosen.runners, chosen.intra, chosen.inter) == (1, 8, 4, 8)
    assert "TensorFlow threads as TF_NUM_INTRAOP_THREADS says" in chosen.why


def test_each_new_worker_takes_the_gpu_fewest_workers_use():
    assert gpu_slot([], 4) == 0
    assert gpu_slot([0, 1], 4) == 2
    assert gpu_slot([0, 2, 3], 4) == 1  # the worker on GPU 1 died: its replacement takes GPU 1
    assert gpu_slot([0, 1], 2) == 0  # more workers than GPUs (asked for): shared in turn


def test_with_several_gpus_each_worker_is_pinned_to_its_own(monkeypatch):
    """gunicorn's pre_fork (in the master) picks the GPU, post_fork (in the worker, before
    TensorFlow loads) makes it the only one the worker sees; one GPU needs neither."""
    import os
    from types import SimpleNamespace

    from keras_pipe_serve.server import gunicorn_settings, settings

    config = settings([])
    assert "pre_fork" not in gunicorn_settings(config, plan(8, 1, None, 0), 1)
    hooks = gunicorn_settings(config, plan(8, 2, None, 0), 2)
    master = SimpleNamespace(WORKERS={})
    for pid in (101, 102):
        worker = SimpleNamespace()
        hooks["pre_fork"](master, worker)
        master.WORKERS[pid] = worker
    assert [w.gpu for w in master.WORKERS.values()] == [0, 1]
    del master.WORKERS[101]  # the worker on GPU 0 died: its replacement takes GPU 0
    replacement = SimpleNamespace()
    hooks["pre_fork"](master, replacement)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hooks["post_fork"](master, replacement)
    assert replacement.gpu == 0 and os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_server_version_the_front_was_not_built_for_is_refused_naming_both():
    """keras_pipe_serve.connections extends uvicorn's h11 protocol, run by uvicorn-worker under
    gunicorn's master, over hooks whose behaviour it was tested with: another version of any of
    them, or none, is said at boot with the version installed and those expected."""
    from importlib.metadata import PackageNotFoundError

    from keras_pipe_serve.connections import wrong_versions

    assert wrong_versions() == []  # (what this environment has: requirements/base.txt's pins)
    built = {"gunicorn": "26.2.0", "uvicorn": "0.54.0", "uvicorn-worker": "0.4.0", "h11": "0.16.0"}

    def installed(**versions):
        def version(name):
            if versions.get(name, built[name]) is None:
                raise PackageNotFoundError(name)
            return versions.get(name, built[name])
        return version

    assert wrong_versions(installed()) == []
    assert wrong_versions(installed(uvicorn="0.54.9", gunicorn="26.9.1")) == []
    assert wrong_versions(installed(uvicorn="0.55.0rc1", gunicorn="26.1.0", h11=None)) == [
        "gunicorn 26.1.0 is installed; this server was built for gunicorn>=26.2,<27",
        "uvicorn 0.55.0rc1 is installed; this server was built for uvicorn>=0.54,<0.55",
        "h11 is not installed; this server was built for h11>=0.16,<0.17"]


def test_each_worker_freezes_what_it_loaded_in_gunicorns_post_worker_init_hook():
    """gc.freeze() once the model is loaded (docs/speed.md: gc.freeze()), in gunicorn's documented
    hook, which a worker calls once its app is loaded."""
    import gc

    from keras_pipe_serve.server import frozen, gunicorn_settings, settings

    assert gunicorn_settings(settings([]), plan(2, 0, None, 0), 0)["post_worker_init"] is frozen
    before = gc.get_freeze_count()
    try:
        frozen(None)
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


def test_a_worker_tells_gunicorns_master_it_is_alive_while_its_model_loads(monkeypatch):
    """uvicorn's loop, which tells the master the worker is alive, starts only once the app (the
    model) is loaded, which may outlast gunicorn's timeout: the worker beats meanwhile, a quarter of
    its timeout apart, and stops once loaded."""
    import time

    from gunicorn.workers.base import Worker as GunicornWorker
    from keras_pipe_serve.connections import Worker

    monkeypatch.setattr(GunicornWorker, "load_wsgi", lambda self: time.sleep(0.5))
    beats = []
    worker = Worker.__new__(Worker)  # (its state but the two the heartbeat reads is gunicorn's to make)
    worker.timeout, worker.notify = 0.2, lambda: beats.append(time.monotonic())
    worker.load_wsgi()
    after = len(beats)
    time.sleep(0.2)
    assert 3 <= after <= 11 and len(beats) == after, beats  # (about 10, fewer on busy cores)
