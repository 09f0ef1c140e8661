"""The recipe's newer elements, each alone on `make demo`'s transfer task, over several seeds: what
each changes in validation accuracy, its spread, and what it costs per training step.

    python -m bench.recipe_elements                 # ~30 minutes on 2 CPU cores: the full task, 5 seeds
    python -m bench.recipe_elements --shots 10 5    # few-shot versions: 10, then 5 training images a class
    python -m bench.recipe_elements --presets       # the presets instead: each chooses its schedule and recipe
    python -m bench.recipe_elements --quick         # a correctness check: one seed, 1 + 2 epochs, meaningless

The task (bench/recipes.py, keras_pipe_launch.demo): a MobileNetV3-Small pretrained from scratch on
digits 0-4 once (seed 0), then transferred to digits 5-9 by `keras-pipe local` in Pipe mode with the
transfer recipe (TRANSFER_RECIPE: 3 head epochs, 12 fine-tuning ones, cosine rate; the demo adds
ema_decay), with one element added. Each row runs SEEDS jobs that differ in the job's `seed` alone
(the head's initialisation, the augmentations' and the mixing's draws; the pretrained backbone and
the order of the records are the same), and gives their validation accuracy (mean, lowest and
highest), their mean validation loss, and the median fine-tuning epoch's seconds (as the job
measures them: its training steps, then its validation pass of the same 180 images; the phase's
first epoch left out, since it traces the step), beside the transfer recipe's: on the full task
23 steps an epoch, so an element's cost per step shows there (diluted by the validation pass it
does not change); a few-shot epoch is mostly its validation pass. With --shots, the training
channel holds the first K images of each digit (the validation channel is the same 180 images).
No flips anywhere: a mirrored digit is another sign, so test_time_flip is not measured here.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

from bench.recipes import hps, in_job_folder
from keras_pipe_launch.demo.__main__ import (
    TRANSFER_RECIPE,
    halves,
    launch_local,
    make_data,
    pretraining,
    split,
    transfer_channels,
    write_shards,
)

SEEDS = 5
BATCH = 32  # (launch_local's batch_size)
ELEMENTS = {
    "the transfer recipe": TRANSFER_RECIPE,
    "layer_decay=0.75": hps(TRANSFER_RECIPE, layer_decay=0.75),
    "ema_decay=0.99": hps(TRANSFER_RECIPE, ema_decay=0.99),
    "mixup_alpha=0.2": hps(TRANSFER_RECIPE, mixup_alpha=0.2),
    "cutmix_alpha=1.0": hps(TRANSFER_RECIPE, cutmix_alpha=1.0),
    "augment=trivial": hps(TRANSFER_RECIPE, augment="trivial"),
    "augment=randaugment": hps(TRANSFER_RECIPE, augment="randaugment"),
}
# The presets (docs/job.md, Presets) choose the rest: the backbone pretrained, the batch and the image size are the
# task's, and no mirror images (flips, test-time flips: a mirrored digit is another sign), as a user who knows
# their images would say (given, so kept). The training set is small by BiT's tiers: no MixUp.
PRESETS = {f"preset={name}": ("--hp", "class_names=5,6,7,8,9", "--hp", "backbone=mobilenet_v3_small",
                              "--hp", f"preset={name}", "--hp", f"augment={augment}", "--hp", "test_time_flip=false")
           for name, augment in (("fast", "crop"), ("balanced", "crop,trivial"), ("best", "crop,trivial"))}


def few_shot(out: Path, shots: int) -> tuple[str, int]:
    """data/digits-5-9-Nshot: the first `shots` training images of each digit of 5-9, and the
    task's validation images; (its name, its training images)."""
    from keras_pipe_train.sources.example import encode_example

    train, _ = split([(jpeg, label) for _, jpeg, label in halves()["digits-5-9"]])  # (make_data's, in order)
    chosen = [record for digit in range(5) for record in [r for r in train if r[1] == digit][:shots]]
    name = f"digits-5-9-{shots}shot"
    write_shards(out / "data" / name / "train", [encode_example(jpeg, label) for jpeg, label in chosen], 1)
    validation = out / "data" / name / "validation"
    validation.mkdir(parents=True)
    for shard in (out / "data" / "digits-5-9" / "validation").iterdir():
        (validation / shard.name).write_bytes(shard.read_bytes())
    return name, len(chosen)


def epoch_seconds(job: Path) -> float:
    """The median fine-tuning epoch's seconds, the phase's first epoch (which traces the step) left out."""
    rows = json.loads((job / "algo-1" / "output" / "data" / "metrics.json").read_text())["epochs"]
    seconds = [row["seconds"] for row in rows if row["phase"] == "fine_tune"][1:]
    return statistics.median(seconds) if seconds else float("nan")


def run(out: Path, args) -> None:
    make_data(out)
    seeds = 1 if args.quick else args.seeds
    epochs = {"epochs": 1, "fine_tune_epochs": 2} if args.quick else {}
    rows = {"the transfer recipe": TRANSFER_RECIPE, **PRESETS} if args.presets else ELEMENTS
    elements = {name: rows[name] for name in list(rows)[:2]} if args.quick else rows
    started = time.perf_counter()
    pretrained = launch_local("pretrain", *pretraining(out, 1 if args.quick else 8), out=out, show=False)
    print(f"pretraining on digits 0-4, from scratch: validation accuracy {pretrained['val_accuracy']:.1%} "
          f"({time.perf_counter() - started:.0f} s)")
    for shots in args.shots:
        data, images = ("digits-5-9", 716) if shots == 0 else few_shot(out, shots)
        print(f"\ntransfer to digits 5-9, {'all' if shots == 0 else shots} training images a class ({images}, "
              f"{math.ceil(images / BATCH)} steps an epoch); {seeds} seed(s) a row")
        print("| element | validation accuracy: mean (lowest-highest) | validation loss | s an epoch | x the transfer "
              "recipe's |\n|---|---|---|---|---|")
        base = None
        for index, (name, recipe) in enumerate(elements.items()):
            finals, times = [], []
            for seed in range(seeds):
                step = f"shots{shots}-{index}-seed{seed}"
                finals.append(launch_local(step, *transfer_channels(out, data), *hps(recipe, seed=seed, **epochs),
                                           out=out, show=False))
                times.append(epoch_seconds(out / step))
            accuracy = [final["val_accuracy"] for final in finals]
            seconds = statistics.median(times)
            base = base or seconds
            loss = statistics.mean(final["val_loss"] for final in finals)
            print(f"| {name} | {statistics.mean(accuracy):.1%} ({min(accuracy):.1%}-{max(accuracy):.1%}) | "
                  f"{loss:.3f} | {seconds:.2f} | {seconds / base:.2f} |", flush=True)


def options(parser) -> None:
    parser.add_argument("--seeds", type=int, default=SEEDS, help=f"jobs a row, seeds 0 to N-1 (default {SEEDS})")
    parser.add_argument("--presets", action="store_true",
                        help="the presets' rows (beside the transfer recipe's) instead of the elements'")
    parser.add_argument("--shots", type=int, nargs="*", default=[0],
                        help="training images a class, one table each (0: all, the default)")


def main(argv: list[str] | None = None) -> int:
    return in_job_folder("bench-recipe-elements-", __doc__, argv, run, options)


if __name__ == "__main__":
    sys.exit(main())
