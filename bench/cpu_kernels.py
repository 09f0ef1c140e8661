"""TensorFlow's CPU kernels for the job's training and serving: oneDNN on or off, and XLA, on the
backbones the job builds, measured side by side in one run on this machine's CPUs.

    python -m bench.cpu_kernels            # ~35 minutes on 2 cores (--only resnet18,... for some)
    python -m bench.cpu_kernels --quick    # tiny: a correctness check, not a benchmark

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it is imported; unset, on Linux it turns oneDNN
on for CPUs with any of AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, whoever made them (and for
Neoverse V1), and logs "oneDNN custom operations are on" when it is on (tensorflow/core/util/port.cc,
DefaultOneDnnPolicy). So each setting runs in a process of its own, started with its environment:
  default          TF_ENABLE_ONEDNN_OPTS unset: what TensorFlow chooses on this CPU
  oneDNN=1, =0     the variable set
  XLA              the default, each training step (and the prediction) compiled by XLA
  XLA, oneDNN=1    the same with the variable set to 1, where the default leaves oneDNN off
                   (elsewhere it is the XLA row's setting, and not measured again)
Each process builds its case's model once with the job's own code (model.classifier: build_backbone
with weights=None, build_classifier, from scratch: every layer and BatchNorm statistic trains),
warms up (tracing or compiling, not counted), then measures on request, in turn with the other
settings' processes (A B C D E, A B C D E, ... so that the machine's drift hits them alike):
  train     images/s of the job's Trainer (training/loop.py: its traced steps, one step per call as
            on CPUs, Adam), on one batch of random images and labels, repeated
  b1, b32   images/s of the model's forward pass on 1 and on 32 images a call (the server batches
            up to 32), in a tf.function as the exported SavedModel calls it
Reported: the median of the repeats with their spread (half the range, of the median), and each
median against the default's. Numerics: before any training, every process predicts the same 32
random images with the same weights (checked by a checksum); the largest difference of a
probability between settings says how much the answers change.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NUM_CLASSES = 10
WARMUP_STEPS = 2  # (the first traces, or compiles, the step; the second runs it once more, not counted)
MIN_TRAIN_STEPS = 2
MIN_PREDICT_CALLS = 2
NUMERICS_IMAGES = 32


@dataclasses.dataclass(frozen=True)
class Case:
    backbone: str
    image_size: int
    batch: int  # training's
    train_s: float  # each measurement's least time training (and at least MIN_TRAIN_STEPS steps)
    predict_s: float  # and predicting, at each batch size (at least MIN_PREDICT_CALLS calls)
    why: str


# (the whole run's time is mostly these, x 4 settings x the repeats, and each process's warm-up)
CASES = (
    Case("resnet18", 32, 128, 5.0, 2.0, "issue 67's case"),
    Case("mobilenet_v3_small", 32, 32, 4.0, 2.0, "the demo's backbone, image size and batch"),
    Case("efficientnet_b0", 224, 16, 5.0, 2.0, "a common transfer backbone at its own size"),
    Case("resnet50", 224, 16, 5.0, 2.0, "the classic, at its own size"),
    Case("mobilenet_v3_small", 64, 32, 4.0, 2.0, "where oneDNN's lead at 224 px turns (settings/cpu_kernels.py)"),
    Case("mobilenet_v3_small", 224, 16, 5.0, 2.0, "the job's default backbone and image size"),
    Case("mobilenet_v2", 224, 16, 5.0, 2.0, "the built-in TensorFlow algorithm's notebook's"),
    Case("resnet18", 224, 16, 5.0, 2.0, "the built-in MXNet algorithm's notebooks' (ResNet-18 at 224)"),
)
QUICK_CASE = Case("tiny", 32, 8, 0.0, 0.0, "one convolution: the machinery, not the model, is checked")


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    onednn: str | None  # TF_ENABLE_ONEDNN_OPTS; None: unset, TensorFlow's choice for this CPU
    xla: bool
    # measured only where TensorFlow's default leaves oneDNN off: elsewhere it is another row's setting
    where_default_off: bool = False

    def environment(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if name != "TF_ENABLE_ONEDNN_OPTS"}
        if self.onednn is not None:
            env["TF_ENABLE_ONEDNN_OPTS"] = self.onednn
        # (INFO: TensorFlow's line saying whether oneDNN is on is an INFO one)
        return {**env, "TF_CPP_MIN_LOG_LEVEL": "0"}


SETTINGS = (Setting("default", None, False), Setting("oneDNN=1", "1", False), Setting("oneDNN=0", "0", False),
            Setting("XLA", None, True), Setting("XLA, oneDNN=1", "1", True, where_default_off=True))
ONEDNN_ON = "oneDNN custom operations are on"  # (TensorFlow's log line, at INFO)
# /proc/cpuinfo's names of the features for which TensorFlow turns oneDNN on by default on Linux
DEFAULT_ONEDNN_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


# --- the measuring process: one case, one setting ---

def build_model(case: Case):
    import keras

    from keras_pipe_train.model.classifier import build_backbone, build_classifier, prepare_from_scratch

    keras.utils.set_random_seed(0)  # (the same weights in every process: checked by weights_checksum)
    if case.backbone == "tiny":
        backbone = keras.Sequential([keras.Input((case.image_size, case.image_size, 3)),
                                     keras.layers.Conv2D(8, 3, strides=2)], name="tiny")
        name = "mobilenet_v3_small"  # (a backbone that scales its input itself: no scaling layer)
    else:
        backbone, name = build_backbone(case.backbone, case.image_size, None), case.backbone
    # as the job builds a backbone trained from scratch: its BatchNorm layers follow the training flag
    model = build_classifier(name, backbone, NUM_CLASSES, 0.0, batchnorm_frozen=False)
    prepare_from_scratch(backbone)
    return model


def weights_checksum(model) -> float:
    return float(sum(np.abs(weights.astype(np.float64)).sum() for weights in model.get_weights()))


def trainer_for(model, xla: bool):
    import tensorflow as tf

    from keras_pipe_train.training.distribute import Cluster
    from keras_pipe_train.training.loop import Trainer

    class CompiledStepTrainer(Trainer):
        """The job's Trainer with each step compiled by XLA. Only the step: the traced function
        around it pulls batches from a tf.data iterator, which XLA cannot compile."""

        def _make_step(self, train: bool, detailed: bool = False, forward=None):
            return tf.function(super()._make_step(train, detailed, forward), jit_compile=True)

    trainer = (CompiledStepTrainer if xla else Trainer)(model, Cluster(tf.distribute.get_strategy(), 1, 0, True),
                                                         mixed_precision=False)
    trainer.start_phase(1e-3)
    return trainer


def endless(images: np.ndarray, labels: np.ndarray):
    """One batch, repeated without end, tf.data's autotuning off: with it on, dropping the iterator
    (leaving the loop) waits for tf.data's autotune thread to wake next (it sleeps 10 ms, then twice
    as long each time), and the measurement would come out as 10.23 s or 20.47 s whatever the steps'
    speed (seen here: the very same images/s from different processes)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_tensors((images, labels)).repeat().with_options(options)


def train_rate(trainer, batches, batch: int, seconds: float, least_steps: int) -> float:
    """Images/s of the Trainer's steps on `batches` (endless) for `seconds`, at least `least_steps`."""
    steps, started = 0, time.perf_counter()
    calls = trainer.calls(True, batches)  # (kept until this returns: its iterator is dropped after the clock)
    for call in calls:
        steps += call.steps
        elapsed = time.perf_counter() - started
        if steps >= least_steps and elapsed >= seconds:
            break
    return steps * batch / elapsed


def predict_rate(predict, images, seconds: float) -> float:
    calls, started = 0, time.perf_counter()
    while calls < MIN_PREDICT_CALLS or time.perf_counter() - started < seconds:
        predict(images).numpy()
        calls += 1
    return calls * len(images) / (time.perf_counter() - started)


def memory_mb() -> dict[str, float]:
    """This process's resident memory now and at its peak (MB), after handing back to the system
    what malloc holds freed: a process waiting its turn should hold no more than it keeps."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024, "peak_mb": int(status["VmHWM"].split()[0]) / 1024}


def measuring(case: Case, setting: Setting, answers_file: Path) -> None:
    """`--worker`: builds, warms up, prints READY; then, for each "measure" line on stdin, one
    measurement as a RESULT line, until stdin closes."""
    import tensorflow as tf

    from keras_pipe_train.model.classifier import logits_of

    model = build_model(case)
    rng = np.random.default_rng(0)
    jit = True if setting.xla else None
    predict = tf.function(lambda images: model(images, training=False), jit_compile=jit)
    shared = rng.uniform(0, 255, (NUMERICS_IMAGES, case.image_size, case.image_size, 3)).astype(np.float32)
    # (before training: the weights are every process's. The logits too: an untrained backbone's
    # features hardly differ between images, and its probabilities may all be close to 1/classes)
    np.savez(answers_file, probabilities=predict(shared).numpy(),
             logits=tf.function(logits_of(model), jit_compile=jit)(shared).numpy())
    checksum = weights_checksum(model)

    images = rng.uniform(0, 255, (case.batch, case.image_size, case.image_size, 3)).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, case.batch).astype(np.int64)
    batches = endless(images, labels)
    trainer = trainer_for(model, setting.xla)
    warmed = time.perf_counter()
    train_rate(trainer, batches, case.batch, 0.0, WARMUP_STEPS)
    for size in (1, 32):
        predict(shared[:size]).numpy()
    print("READY " + json.dumps({"checksum": checksum, "tensorflow": tf.__version__,
                                 "warmup_s": time.perf_counter() - warmed, **memory_mb()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "measure":
            continue
        result = {"train": train_rate(trainer, batches, case.batch, case.train_s, MIN_TRAIN_STEPS),
                  "b1": predict_rate(predict, shared[:1], case.predict_s),
                  "b32": predict_rate(predict, shared, case.predict_s)}
        print("RESULT " + json.dumps({**result, **memory_mb()}), flush=True)


# --- the conducting process ---

class Worker:
    """A measuring process of one setting, started with its environment; its log beside it."""

    def __init__(self, case: Case, setting: Setting, work: Path):
        stem = f"{case.backbone}-{setting.name}".replace(", ", "-").replace("=", "")
        self.setting, self.log = setting, work / f"{stem}.log"
        self.answers_file = work / f"{stem}.npz"
        spec = json.dumps({"case": dataclasses.asdict(case), "setting": dataclasses.asdict(setting),
                           "answers": str(self.answers_file)})
        self.process = subprocess.Popen([sys.executable, "-m", "bench.cpu_kernels", "--worker", spec],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.log, "wb"),
                                        text=True, env=setting.environment())
        self.ready: dict = {}

    def answer(self, prefix: str) -> dict:
        for line in self.process.stdout:
            if line.startswith(prefix + " "):
                return json.loads(line[len(prefix) + 1:])
        self.process.wait()
        raise SystemExit(f"the {self.setting.name} process exited {self.process.returncode} before its {prefix} "
                         f"line; its log, {self.log}:\n{self.log.read_text()[-3000:]}")

    def wait_ready(self) -> dict:
        self.ready = self.answer("READY")
        return self.ready

    def measure(self) -> dict:
        self.process.stdin.write("measure\n")
        self.process.stdin.flush()
        return self.answer("RESULT")

    def onednn_line(self) -> str:
        """TensorFlow's own log line about oneDNN, its first sentence; "" when it logged none."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if "onednn" in line.lower()]
        return lines[0].split("] ", 1)[-1].split(". ")[0] if lines else ""

    def close(self) -> None:
        self.process.stdin.close()
        if self.process.wait(timeout=120):
            raise SystemExit(f"the {self.setting.name} process exited {self.process.returncode}; its log, "
                             f"{self.log}:\n{self.log.read_text()[-3000:]}")


@dataclasses.dataclass
class Measured:
    setting: Setting
    results: list[dict]
    answers: dict[str, np.ndarray]  # probabilities and logits of the NUMERICS_IMAGES, before any training
    onednn_line: str
    checksum: float
    warmup_s: float
    tensorflow: str
    peak_mb: float  # the process's peak resident memory

    def median(self, metric: str) -> float:
        return statistics.median(result[metric] for result in self.results)

    def spread(self, metric: str) -> float:
        """Half the range of the repeats, of their median."""
        values = [result[metric] for result in self.results]
        return (max(values) - min(values)) / 2 / self.median(metric)


def measure_case(case: Case, settings: tuple[Setting, ...], repeats: int, work: Path) -> dict[str, Measured]:
    """Every setting's process started and warmed up, one after the other (so that only one is at
    its peak of memory at a time; the default's first, whose log says whether oneDNN is on by
    default), then measured in turn, `repeats` rounds."""
    workers: list[Worker] = []
    try:
        for setting in settings:
            default_on = workers and workers[0].onednn_line().startswith(ONEDNN_ON)
            if setting.where_default_off and default_on:
                continue
            workers.append(Worker(case, setting, work))
            workers[-1].wait_ready()
        results: dict[str, list[dict]] = {setting.name: [] for setting in settings}
        for _ in range(repeats):
            for worker in workers:
                results[worker.setting.name].append(worker.measure())
        for worker in workers:
            worker.close()
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()
    measured = {worker.setting.name: Measured(worker.setting, results[worker.setting.name],
                                              dict(np.load(worker.answers_file)), worker.onednn_line(),
                                              worker.ready["checksum"], worker.ready["warmup_s"],
                                              worker.ready["tensorflow"],
                                              max(r["peak_mb"] for r in [worker.ready, *results[worker.setting.name]]))
                for worker in workers}
    checksums = {name: m.checksum for name, m in measured.items()}
    if len(set(checksums.values())) > 1:
        raise SystemExit(f"{case.backbone}: the processes built different weights ({checksums}): the numerics "
                         "comparison needs the same")
    return measured


def cpu_description() -> str:
    """The CPU's model name, its cores here, and whether it has AVX2, AVX-512 and the instructions that
    TensorFlow's default choice of oneDNN looks at (DEFAULT_ONEDNN_FLAGS)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {name.strip(): value.strip() for name, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    listed = ("avx2", "avx512f", *DEFAULT_ONEDNN_FLAGS)
    return (f"{fields.get('model name', 'unknown')} ({fields.get('vendor_id', '?')}, family "
            f"{fields.get('cpu family', '?')} model {fields.get('model', '?')}), {len(os.sched_getaffinity(0))} cores; "
            + ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in listed))


COLUMNS = "{:34} {:15} | {:>13} {:>6} | {:>13} {:>6} | {:>13} {:>6}"


def table(cases: list[tuple[Case, dict[str, Measured]]]) -> list[str]:
    lines = [COLUMNS.format("model (image size, training batch)", "setting", "train img/s", "x def",
                            "predict b1", "x def", "predict b32", "x def")]
    for case, measured in cases:
        default = measured["default"]
        for name, m in measured.items():
            cells = []
            for metric in ("train", "b1", "b32"):
                cells += [f"{m.median(metric):7.1f} ±{m.spread(metric):3.0%}",
                          f"{m.median(metric) / default.median(metric):5.2f}"]
            lines.append(COLUMNS.format(f"{case.backbone} ({case.image_size} px, {case.batch})", name, *cells))
    return lines


def numerics(case: Case, measured: dict[str, Measured]) -> str:
    """Between pairs of settings, on the same weights and images: the largest difference of a
    probability, and of a logit (of the logits' range), and how many images get the same class."""
    pairs = [("oneDNN=1", "oneDNN=0"), ("default", "oneDNN=0"), ("XLA", "default"), ("XLA, oneDNN=1", "oneDNN=1")]
    parts = []
    for a, b in pairs:
        if a in measured and b in measured:
            p, q = measured[a].answers["probabilities"], measured[b].answers["probabilities"]
            logits, others = measured[a].answers["logits"], measured[b].answers["logits"]
            relative = np.abs(logits - others).max() / np.ptp(others)
            agree = np.mean(p.argmax(-1) == q.argmax(-1))
            parts.append(f"{a} vs {b} {np.abs(p - q).max():.1e}, logits {relative:.1e} ({agree:.0%} same class)")
    top = np.median(measured["default"].answers["probabilities"].max(-1))
    return (f"{case.backbone}: max |difference| of a probability, {NUMERICS_IMAGES} images, same weights (the "
            f"default's median top probability {top:.2f}), and of a logit, of their range: " + "; ".join(parts))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny: a correctness check, not a benchmark")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each setting (default 3)")
    parser.add_argument("--only", help="these backbones alone, comma-separated: " + ",".join(
        case.backbone for case in CASES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        return measuring(Case(**spec["case"]), Setting(**spec["setting"]), Path(spec["answers"]))
    cases, repeats = ([QUICK_CASE], 2) if args.quick else (list(CASES), args.repeats)
    if args.only:
        cases = [case for case in cases if case.backbone in args.only.split(",")]
    print(f"CPU: {cpu_description()}")
    started, done = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-kernels-") as work:
        for case in cases:
            measured = measure_case(case, SETTINGS, repeats, Path(work))
            done.append((case, measured))
            print(f"{case.backbone} at {case.image_size} px, training batch {case.batch} ({case.why}): measured "
                  f"{repeats} times each; by setting, warm-up (tracing, compiling) and peak memory: " + ", ".join(
                      f"{name} {m.warmup_s:.0f} s {m.peak_mb:.0f} MB" for name, m in measured.items()), flush=True)
    first = done[0][1]
    print(f"TensorFlow {first['default'].tensorflow}; its log line about oneDNN, by setting:")
    for name, m in first.items():
        print(f"  {name:14} {m.onednn_line or '(none: oneDNN off)'}")
    skipped = [setting.name for setting in SETTINGS if setting.where_default_off and setting.name not in first]
    if skipped:
        print(f"  not measured, as oneDNN is on by default here (the XLA row's setting): {', '.join(skipped)}")
    print("\n".join(table(done)))
    for case, measured in done:
        print(numerics(case, measured))
    print(f"(median of {repeats} ± half their range, of the median; x def: median / the default's median; "
          f"{time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
