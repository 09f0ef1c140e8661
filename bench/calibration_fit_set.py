"""How the temperature should be fitted when some validation labels are wrong: by the plain NLL on
every image (the job's fit until issue 70), by the plain NLL on the images the label check does not
suspect (what issue 70 asked to consider), or by the likelihood of the labels as given, some of
them wrong (training/calibration.py's docstring: what the job does). Measured on simulated models
whose true calibration is known, scored on a test set's true labels, in one run on this machine.

    python -m bench.calibration_fit_set            # ~2 minutes on 2 CPU cores
    python -m bench.calibration_fit_set --quick    # a correctness check: two seeds, one of each regime

Why simulated: the question is what the fit does to a model right on a given share of images, as
confident as it should be or more, with a given share of its validation labels wrong. A real job
gives one point of that space per training; a simulation gives each point as often as asked, and
the truth to score against.

The simulated model: an image of class y has evidence x = MU * onehot(y) + N(0, 1) per class; the
model that knows this answers softmax(MU * x), which is calibrated exactly (its probabilities are the
Bayes posterior). A model OVERCONFIDENT by s answers softmax(s * MU * x): its best temperature is s.
MU sets how often the model is right. The validation set (VALIDATION images, CLASSES classes) has a
share of its labels flipped to another class at random; the temperature is fitted on it by the job's
own calibration.calibrate with its default, calibration=auto (T = 1 where auto does not apply it),
by the plain NLL on every image, and by the plain NLL on those that label_errors.find (the job's
label check, on the uncalibrated probabilities) does not suspect (each plain fit served unless at
the temperature's lower bound, as the job's). Each is scored on TEST fresh images' true labels:
ECE, NLL and the temperature served against the right one; beside them, the model as it is, and
at its right temperature.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from keras_pipe_train.training import calibration, label_errors

CLASSES = 10
VALIDATION = 600  # the demo's transfer task has 597 validation images; the e2e test's 200
TEST = 20_000
SEEDS = tuple(range(10))
ACCURACY_MU = {"right on ~60 %": 2.0, "right on ~85 %": 3.0, "right on ~97 %": 4.0, "right on ~99.7 %": 5.0}
OVERCONFIDENT = (1.0, 2.0)  # s: 1 calibrated, 2 as overconfident as fine-tuned networks often are
FLIPPED = (0.0, 0.05, 0.10, 0.20)


def model_logits(mu: float, s: float, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` images' true classes and the logits of the module's simulated model."""
    truth = rng.integers(0, CLASSES, count)
    evidence = rng.standard_normal((count, CLASSES))
    evidence[np.arange(count), truth] += mu
    return s * mu * evidence, truth


def flipped(truth: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    given = truth.copy()
    flips = rng.random(len(truth)) < rate
    given[flips] = (truth[flips] + rng.integers(1, CLASSES, flips.sum())) % CLASSES
    return given


def one(mu: float, s: float, rate: float, seed: int) -> dict:
    """One model, validation set and test set: each fit's test figures."""
    rng = np.random.default_rng(seed)
    logits, truth = model_logits(mu, s, VALIDATION, rng)
    given = flipped(truth, rate, rng)
    test_logits, test_truth = model_logits(mu, s, TEST, rng)
    suspected = np.zeros(len(given), bool)
    suspected[label_errors.find(calibration.tempered(logits, 1.0, False), given).indices] = True
    figures = {"accuracy": float((test_logits.argmax(axis=1) == test_truth).mean()),
               "suspected": int(suspected.sum()), "flipped": int((given != truth).sum())}
    job = calibration.calibrate(logits, given, False, "auto", seed)
    figures["label_noise"], figures["applied"] = job.label_noise, job.applied
    for name, temperature in (("none", 1.0), ("right", s), ("plain", plain_temperature(logits, given)),
                              ("unsuspected", plain_temperature(logits[~suspected], given[~suspected])),
                              ("job", job.temperature if job.applied else 1.0)):
        scored = calibration.scores(test_logits / temperature, test_truth, False)
        figures[name] = {"T": float(temperature), "ece": scored["ece"], "nll": scored["nll"]}
    return figures


def plain_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature of least plain NLL (every label taken as right), within the job's range."""
    low, high = (np.full(1, 1 / bound) for bound in calibration.TEMPERATURE_RANGE)

    def nll(betas):
        return np.array([calibration.scores(logits * beta, labels, False)["nll"] for beta in betas])

    fitted = float(1 / calibration._golden(nll, low, high, calibration.SEARCH_STEPS)[0])
    return 1.0 if calibration.at_bound(fitted) else fitted  # (as the job: a fit at the lower bound is not served)


def run(seeds: tuple[int, ...], regimes: dict, overconfident: tuple, rates: tuple) -> None:
    print(f"{CLASSES} classes, {VALIDATION} validation images, {TEST:,} test images; seeds {seeds[0]}-{seeds[-1]}: "
          "the mean (the range)\n")
    print("| model | overconfident by | labels wrong | suspected (wrong) | wrong, as the job's fit finds "
          "| the job's applied (auto) | test ECE: "
          "as it is / plain NLL / plain, unsuspected / the job's fit / the right T | test NLL: plain / unsuspected / "
          "the job's / right | T served: plain / unsuspected / the job's (right: s) |\n" + "|---" * 9 + "|")
    for regime, mu in regimes.items():
        for s in overconfident:
            for rate in rates:
                runs = [one(mu, s, rate, seed) for seed in seeds]

                def cell(name, key, form=".3f"):
                    values = [r[name][key] for r in runs]
                    return f"{np.mean(values):{form}} ({min(values):{form}}-{max(values):{form}})"

                def cells(key, names, form=".3f"):
                    return " / ".join(cell(name, key, form) for name in names)

                print(f"| {regime} (test: {np.mean([r['accuracy'] for r in runs]):.1%}) | {s:g} | {rate:.0%} "
                      f"| {np.mean([r['suspected'] for r in runs]):.0f} ({np.mean([r['flipped'] for r in runs]):.0f}) "
                      f"| {np.mean([r['label_noise'] for r in runs]):.1%} "
                      f"| {sum(r['applied'] for r in runs)} of {len(runs)} "
                      f"| {cells('ece', ('none', 'plain', 'unsuspected', 'job', 'right'))} "
                      f"| {cells('nll', ('plain', 'unsuspected', 'job', 'right'))} "
                      f"| {cells('T', ('plain', 'unsuspected', 'job'), '.2f')} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    if parser.parse_args(argv).quick:
        run(SEEDS[:2], dict(list(ACCURACY_MU.items())[::3]), OVERCONFIDENT[1:], FLIPPED[::2])
    else:
        run(SEEDS, ACCURACY_MU, OVERCONFIDENT, FLIPPED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
