"""Training recipes on `make demo`'s transfer task, and a multi-label variant of it: each one's
validation metrics and wall time, measured in one run on this machine.

    python -m bench.recipes            # ~5 minutes on 2 CPU cores
    python -m bench.recipes --quick    # a correctness check: one epoch each, numbers meaningless

The task (keras_pipe_launch.demo): a MobileNetV3-Small backbone pretrained from scratch on digits
0-4 (File mode), then each recipe transfers it to digits 5-9, classes it never saw, streamed
through Pipe-mode FIFOs by `keras-pipe local`, exactly as `make demo` does. The multi-label variant
transfers the same backbone to pictures of two different digits of 5-9 side by side, each labelled
with both (`multi_label=true`): chance there is an F1 of about 0.4 (two of five classes). Every job
uses seed 0; differences of up to 3 points between recipes are within what another seed gives (the
demo's recipe, over 8 pretraining seeds: 93.3-96.7 %). "epoch" is
the one the exported model comes from (early stopping's best), "time" the job's wall time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from keras_pipe_launch.demo.__main__ import TRANSFER_RECIPE, launch_local, make_data, pretraining, transfer_channels


def hps(recipe: tuple[str, ...], **changes) -> tuple[str, ...]:
    """`recipe`'s --hp options with `changes` made (a value of None leaves that one out)."""
    values = dict(item.split("=", 1) for item in recipe[1::2])
    values.update({name: str(value) for name, value in changes.items()})
    return tuple(part for name, value in values.items() if value != "None" for part in ("--hp", f"{name}={value}"))


RECIPES = {
    "the demo's: adam, cosine, 3 head + 12 fine-tuning epochs": TRANSFER_RECIPE,
    "nesterov, cosine, 30 warmup steps, clipping at 1": hps(
        TRANSFER_RECIPE, optimizer="nesterov", learning_rate=0.05, fine_tune_learning_rate=0.002,
        lr_schedule="cosine", warmup_steps=30, gradient_clip_norm=1.0),
    "adamw, cosine, label smoothing 0.1, early stopping": hps(TRANSFER_RECIPE, optimizer="adamw", label_smoothing=0.1,
                                                      early_stopping="true", early_stopping_patience=3),
    # (no flip: a mirrored digit is another sign)
    "augment=crop,rotate,zoom,aspect,shear": hps(TRANSFER_RECIPE, augment="crop,rotate,zoom,aspect,shear"),
    "augment=all (with flip and color too)": hps(TRANSFER_RECIPE, augment="all"),
}
MULTI_LABEL = hps(TRANSFER_RECIPE, multi_label="true")


def make_pairs(out: Path, count: int = 1000) -> None:
    """Two different digits of 5-9 side by side, labelled with both (ids 0-4 for digits 5-9)."""
    import numpy as np

    from keras_pipe_launch.demo.__main__ import write_shards
    from keras_pipe_launch.sample_data import digit_pairs, load_digits, pair_examples

    images, labels = load_digits()
    high = labels >= 5
    pairs, classes = digit_pairs(images[high], labels[high] - 5, count, seed=1)
    records = pair_examples(pairs, classes)
    cut = int(count * 0.8)
    write_shards(out / "data/pairs-5-9/train", records[:cut], 4)
    write_shards(out / "data/pairs-5-9/validation", records[cut:], 1)
    print(f"multi-label data: {count} pictures of two digits of 5-9 ({np.mean([len(c) for c in classes]):.0f} labels "
          "each)")


def quick(recipe: tuple[str, ...]) -> tuple[str, ...]:
    """The recipe in one head epoch and one fine-tuning epoch."""
    return hps(recipe, epochs=1, fine_tune_epochs=1)


def in_job_folder(prefix: str, doc: str, argv: list[str] | None, body, options=None) -> int:
    """A benchmark's main: its --quick option, then body(folder, quick) with a new temporary folder
    for its jobs, removed after; kept (and said) when a job fails, which ends the run with SystemExit.
    `options`: adds the benchmark's own options to the parser; body(folder, the parsed arguments) then."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    if options:
        options(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        body(out, args if options else args.quick)
    except SystemExit:
        print(f"(the jobs' folders and logs are kept in {out})", file=sys.stderr)
        raise
    shutil.rmtree(out, ignore_errors=True)
    return 0


def run(out: Path, quick_run: bool) -> None:
    adjust = quick if quick_run else (lambda recipe: recipe)
    make_data(out)
    make_pairs(out, 200 if quick_run else 1000)
    started = time.perf_counter()
    pretrained = launch_local("pretrain", *pretraining(out, 1 if quick_run else 8), out=out, show=False)
    print(f"pretraining on digits 0-4, from scratch: validation accuracy {pretrained['val_accuracy']:.1%} "
          f"({time.perf_counter() - started:.0f} s)\n")
    print(f"{'transfer to digits 5-9, recipe':<62} {'val accuracy':>12} {'val loss':>9} {'epoch':>6} {'time':>7}")
    for index, (name, recipe) in enumerate(RECIPES.items()):
        started = time.perf_counter()
        final = launch_local(f"recipe-{index}", *transfer_channels(out), *adjust(recipe), out=out, show=False)
        print(f"{name:<62} {final['val_accuracy']:>12.1%} {final['val_loss']:>9.3f} {final['epoch']:>6} "
              f"{time.perf_counter() - started:>6.0f}s", flush=True)
    started = time.perf_counter()
    final = launch_local("multi-label", *transfer_channels(out, "pairs-5-9"), *adjust(MULTI_LABEL), out=out,
                         show=False)
    print(f"\nmulti-label: two digits of 5-9 an image ({time.perf_counter() - started:.0f} s, the demo's recipe): "
          f"F1 micro {final['val_f1_micro']:.3f}, F1 macro {final['val_f1_macro']:.3f}, "
          f"AUC {final['val_auc']:.3f}, images with both digits right (and no other) "
          f"{final['val_accuracy']:.1%}")


def main(argv: list[str] | None = None) -> int:
    return in_job_folder("bench-recipes-", __doc__, argv, run)


if __name__ == "__main__":
    sys.exit(main())
