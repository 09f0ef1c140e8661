"""How the temperature should be fitted when some validation labels are wrong. Three fits, and
the job's default use of the first, on simulated models whose true calibration is known, scored
on a test set's true labels, in one run on this machine:

  plain        the NLL of every validation image's label (the job's fit: calibration.py), and
               "auto": the same, served only where calibration=auto applies it (T = 1 elsewhere),
               given the label check's suspects, as the job serves it by default;
  unsuspected  the same NLL on the images the label check (label_errors.find, on the uncalibrated
               probabilities) does not suspect: what issue 70 asked to consider;
  noisy        the likelihood of the labels as given, some of them wrong: each label is the
               class's with probability (1 - r) p + r (1 - p) / (classes - 1), p the calibrated
               probability of it, r the share of wrong labels, fitted with T (each T's likeliest
               r, within [0, MAX_LABEL_NOISE]).

    python -m bench.calibration_fit_set            # ~3 minutes on 2 CPU cores
    python -m bench.calibration_fit_set --quick    # a correctness check: two seeds, one of each regime

Why simulated: the question is what a fit does to a model right on a given share of images, as
confident as it should be or more, with a given share of its validation labels wrong. A real job
gives one point of that space per training; a simulation gives each point as often as asked, and
the truth to score against. The simulated model: an image of class y has evidence x = MU *
onehot(y) + N(0, 1) per class; the model that knows this answers softmax(MU * x), which is
calibrated exactly (its probabilities are the Bayes posterior). A model OVERCONFIDENT by s answers
softmax(s * MU * x): its right temperature is s. MU sets how often the model is right. The
validation set (VALIDATION images, CLASSES classes) has a share of its labels flipped to another
class at random. Each fit is served as the job serves a fit (not at the temperature's lower bound:
T = 1 there) and scored on TEST fresh images' true labels: ECE, NLL and the temperature served.
Beside them, the model as it is, and at its right temperature.

Last, the other side of auto's last condition: the model right on ~97 %, overconfident by 2, no
label wrong, but MISTAKEN shares of its images replaced by confident mistakes (the label check
suspects them as it would wrong labels; "the right T" is then no longer s). A real network's
mistakes are neither all Gaussian nor all of this kind: docs/speed.md ("Which images the
temperature is fitted on") gives what the noisy fit did on real jobs, and why the job keeps the
plain fit.
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
# auto's last condition's other side: no label wrong, but a share of images the model is confidently
# wrong on (model_logits), as a real network's mistakes often are
MISTAKEN = (0.05, 0.07, 0.10)
MISTAKE_LOGIT = 12.0  # (the outside review's case, whose figures docs/speed.md gives)
MAX_LABEL_NOISE = 0.5  # the noisy fit's most wrong labels: beyond, labels say less than chance


def model_logits(mu: float, s: float, count: int, rng: np.random.Generator, mistaken: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """`count` images' true classes and the logits of the module's simulated model; a share
    `mistaken` of them replaced by confident mistakes: logits N(0, 2), another class's raised by
    MISTAKE_LOGIT (the model sure of a wrong class, its label right)."""
    truth = rng.integers(0, CLASSES, count)
    evidence = rng.standard_normal((count, CLASSES))
    evidence[np.arange(count), truth] += mu
    logits = s * mu * evidence
    if mistaken:
        wrong = rng.random(count) < mistaken
        logits[wrong] = rng.standard_normal((int(wrong.sum()), CLASSES)) * 2
        logits[wrong, (truth[wrong] + rng.integers(1, CLASSES, wrong.sum())) % CLASSES] += MISTAKE_LOGIT
    return logits, truth


def flipped(truth: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    given = truth.copy()
    flips = rng.random(len(truth)) < rate
    given[flips] = (truth[flips] + rng.integers(1, CLASSES, flips.sum())) % CLASSES
    return given


def golden(loss, low: float, high: float) -> float:
    """The point of least `loss` (a scalar's, unimodal) within [low, high]: the job's search."""
    point = calibration.golden_section(lambda points: np.array([loss(float(x)) for x in points]),
                                       np.array([low]), np.array([high]))
    return float(point[0])


def noisy_fit(logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """The noisy fit's temperature and share of wrong labels."""
    z = np.asarray(logits, np.float64)

    def at(beta: float) -> tuple[float, float]:  # (the likeliest r at 1 / beta, and the NLL there)
        scaled = z * beta
        top = scaled.max(axis=1)
        log_p = scaled[np.arange(len(labels)), labels] - top - np.log(np.exp(scaled - top[:, None]).sum(axis=1))
        p = np.exp(log_p)

        def nll(rate: float) -> float:  # (convex in r: -log of what is affine in it)
            if rate == 0:
                return float(-log_p.mean())
            return float(-np.log(np.maximum((1 - rate) * p + rate * (1 - p) / (CLASSES - 1), 1e-300)).mean())

        rate = golden(nll, 0.0, MAX_LABEL_NOISE)
        return min(((0.0, nll(0.0)), (rate, nll(rate))), key=lambda pair: pair[1])

    low, high = (1 / bound for bound in calibration.TEMPERATURE_RANGE[::-1])
    beta = golden(lambda b: at(b)[1], low, high)
    return 1 / beta, at(beta)[0]


def served(temperature: float) -> float:
    """As the job serves a fit: not at the temperature's lower bound (T = 1 there)."""
    return 1.0 if calibration.at_bound(temperature) else float(temperature)


def one(mu: float, s: float, rate: float, seed: int, mistaken: float = 0.0) -> dict:
    """One model, validation set and test set: each fit's test figures."""
    rng = np.random.default_rng(seed)
    logits, truth = model_logits(mu, s, VALIDATION, rng, mistaken)
    given = flipped(truth, rate, rng)
    test_logits, test_truth = model_logits(mu, s, TEST, rng, mistaken)
    suspected = np.zeros(len(given), bool)
    suspected[label_errors.find(calibration.tempered(logits, 1.0, False), given).indices] = True
    noisy, noise = noisy_fit(logits, given)
    auto = calibration.calibrate(logits, given, False, "auto", seed, suspected=suspected)
    figures = {"accuracy": float((test_logits.argmax(axis=1) == test_truth).mean()), "applied": auto.applied,
               "suspected": int(suspected.sum()), "flipped": int((given != truth).sum()), "label_noise": noise}
    kept = ~suspected
    for name, temperature in (("none", 1.0), ("right", s), ("plain", calibration.fit_temperature(logits, given, False)),
                              ("auto", auto.temperature if auto.applied else 1.0),
                              ("unsuspected", calibration.fit_temperature(logits[kept], given[kept], False)),
                              ("noisy", noisy)):
        temperature = served(temperature)
        scored = calibration.scores(test_logits / temperature, test_truth, False)
        figures[name] = {"T": temperature, "ece": scored["ece"], "nll": scored["nll"]}
    return figures


def run(seeds: tuple[int, ...], regimes: dict, overconfident: tuple, rates: tuple, mistaken: tuple) -> None:
    print(f"{CLASSES} classes, {VALIDATION} validation images, {TEST:,} test images; seeds {seeds[0]}-{seeds[-1]}: "
          "the mean (the range)\n")
    fits = ("plain", "auto", "unsuspected", "noisy")
    print("| model | overconfident by | labels wrong | suspected (wrong) | wrong, as the noisy fit finds "
          "| auto applied | test ECE: as it is / plain / auto (the job's) / unsuspected / noisy / the right T "
          "| test NLL: plain / auto / unsuspected / noisy / right "
          "| T served: plain / auto / unsuspected / noisy (right: s) |\n"
          + "|---" * 9 + "|")
    cases = [(regime, mu, s, rate, 0.0) for regime, mu in regimes.items() for s in overconfident for rate in rates]
    cases += [(f"right on ~97 %, {share:.0%} of images confidently wrong", ACCURACY_MU["right on ~97 %"], 2.0, 0.0,
               share) for share in mistaken]
    for regime, mu, s, rate, share in cases:
        runs = [one(mu, s, rate, seed, share) for seed in seeds]

        def cells(key, names, form=".3f", runs=runs):
            values = ([r[name][key] for r in runs] for name in names)
            return " / ".join(f"{np.mean(v):{form}} ({min(v):{form}}-{max(v):{form}})" for v in values)

        print(f"| {regime} (test: {np.mean([r['accuracy'] for r in runs]):.1%}) | {s:g} | {rate:.0%} "
              f"| {np.mean([r['suspected'] for r in runs]):.0f} ({np.mean([r['flipped'] for r in runs]):.0f}) "
              f"| {np.mean([r['label_noise'] for r in runs]):.1%} "
              f"| {sum(r['applied'] for r in runs)} of {len(runs)} "
              f"| {cells('ece', ('none', *fits, 'right'))} | {cells('nll', (*fits, 'right'))} "
              f"| {cells('T', fits, '.2f')} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    if parser.parse_args(argv).quick:
        run(SEEDS[:2], dict(list(ACCURACY_MU.items())[::3]), OVERCONFIDENT[1:], FLIPPED[::2], MISTAKEN[1:2])
    else:
        run(SEEDS, ACCURACY_MU, OVERCONFIDENT, FLIPPED, MISTAKEN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
