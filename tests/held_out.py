"""Whether a job's exported model learned each class under its own name: the SavedModel's answers
(class names) for digits no test trains on, scored per class against the digits' own labels.

A job reads each source's labels its own way (class folders' names, an MXNet record's header, a
Ground Truth line's class id) and the model names its outputs from class_names: a label read one
off, or classes listed in another order than they were numbered, trains a model that names every
digit as another one, while the job's own metrics, computed on labels read the same wrong way, look
fine. Only an answer checked against labels that never went through the job can tell; and only
per class: one class's images all answered right is what a constant model does.
"""

from __future__ import annotations

import functools

# A job that learns the digits in about the time the quickest one (mobilenet_v3_small, one epoch)
# took to learn nothing: MobileNet (v1) from scratch, 32x32 images, 3 epochs of 600 of them at a
# cosine-decayed rate: 25-33 s here. At a constant rate, 3 epochs swung from 71 to 89 % of the
# held-out digits right, the weakest class from 14 to 73 %.
LEARNS = {"backbone": "mobilenet", "weights": "none", "image_size": 32, "batch_size": 16, "augment": "false",
          "epochs": 3, "learning_rate": 0.003, "lr_schedule": "cosine"}
TRAINED = 600  # digits 0-599: what a job that LEARNS trains on
# What a model that LEARNS must answer right, on the held-out digits (22 to 42 a class; chance: 1
# in 10 of each class, and a model that named its classes one off or in another order would answer
# nearly none of a class right). Seen over 15 trainings (class folders, Ground Truth lines and MXNet
# records with seeds 0-3, TFRecords with seeds 1-3): 86-95 % of all of them right; the weakest
# class 65-91 % in 14, once 39 % (sevens from class folders, seed 3). So each class at least 30 %
# (3 times chance: for a class of 22 images, 7 right where chance gives 2), all of them 70 %.
MINIMUM, OVERALL = 0.3, 0.7
NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
HELD_OUT = 1500  # digits 1500-1796 (297 images, 22 to 42 a class) are never trained on by these tests


@functools.cache
def held_out_digits(size: int = 32) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """(JPEGs, labels) of the held-out digits."""
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, labels = load_digits()
    return tuple(digit_jpeg(image, size) for image in images[HELD_OUT:]), tuple(int(y) for y in labels[HELD_OUT:])


def answered_names(model_dir, jpegs) -> list[str]:
    """The class names the exported SavedModel (`model_dir`, holding 1/) answers for `jpegs`."""
    import tensorflow as tf

    serve = tf.saved_model.load(str(model_dir / "1")).signatures["serving_default"]
    names = []
    for start in range(0, len(jpegs), 64):
        answer = serve(image_bytes=tf.constant(list(jpegs[start : start + 64])))
        names += [name.decode() for name in answer["classes"].numpy()]
    return names


def per_class_accuracy(answered: list[str], truth: list[str]) -> dict[str, float]:
    """For each true class, the share of its images answered with its name."""
    shares = {}
    for name in sorted(set(truth), key=truth.index):
        answers = [a for a, t in zip(answered, truth) if t == name]
        shares[name] = sum(a == name for a in answers) / len(answers)
    return shares


def assert_each_class_learned(answered: list[str], truth: list[str], minimum: float = MINIMUM,
                              overall: float = OVERALL) -> dict[str, float]:
    """Every class's held-out images answered with its name at least `minimum` of the time, and
    all of them at least `overall`."""
    shares = per_class_accuracy(answered, truth)
    right = sum(a == t for a, t in zip(answered, truth)) / len(truth)
    shown = {name: round(share, 3) for name, share in shares.items()}
    weak = {name: share for name, share in shown.items() if share < minimum}
    assert not weak and right >= overall, (
        f"{right:.1%} of the held-out images answered right (at least {overall:.0%} expected); classes answered "
        f"right less than {minimum:.0%} of the time: {weak or 'none'}; every class: {shown}")
    return {"overall": round(right, 3), **shown}


def assert_the_model_learned_each_digit(model_dir, names=NAMES) -> dict[str, float]:
    """The exported model answers each held-out digit's class name (`names[label]`), class by
    class (assert_each_class_learned)."""
    jpegs, labels = held_out_digits()
    return assert_each_class_learned(answered_names(model_dir, jpegs), [names[y] for y in labels])


def hp_options(**values) -> list[str]:
    """`keras-pipe local` options setting these hyperparameters (LEARNS, say)."""
    return [option for key, value in values.items() for option in ("--hp", f"{key}={value}")]


def write_held_out_digits(folder, names=NAMES) -> None:
    """The held-out digits as JPEG files, in one folder per class: folder/seven/1523.jpg."""
    jpegs, labels = held_out_digits()
    for index, (jpeg, label) in enumerate(zip(jpegs, labels)):
        (folder / names[label]).mkdir(parents=True, exist_ok=True)
        (folder / names[label] / f"{HELD_OUT + index}.jpg").write_bytes(jpeg)


def assert_each_folder_predicted_as_its_class(predictions_csv: str) -> dict[str, float]:
    """`keras-pipe predict`'s CSV for write_held_out_digits' folders: each class's images are
    predicted as it (their folder's name), class by class (assert_each_class_learned)."""
    import csv
    import io
    from pathlib import PurePath

    rows = list(csv.DictReader(io.StringIO(predictions_csv)))
    assert len(rows) == len(held_out_digits()[1]), predictions_csv[-2000:]
    return assert_each_class_learned([row["predicted"] for row in rows],
                                     [PurePath(row["path"]).parent.name for row in rows])
