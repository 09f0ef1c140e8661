"""The likely label errors the job found (training/label_errors.py), as a person and a program read
them: output/data/label_errors.csv, every suspect, and the report page's section, the first
MAX_SHOWN of each set with their pictures.

    label_errors.csv    set (train or validation), rank (1: the given label least likely),
                        fingerprint (16 hex digits: tf.fingerprint of the encoded image, the same
                        for the same image bytes wherever they are), given_label, likely_label,
                        given_probability, likely_probability
    label_errors.json   the check's figures: folds, seconds, which features the training images'
                        heads read, and each set's images examined and suspected
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from keras_pipe_train.report import pages
from keras_pipe_train.training.gathered import Gathered
from keras_pipe_train.training.label_errors import Suspects

CSV_NAME = "label_errors.csv"
JSON_NAME = "label_errors.json"
MAX_SHOWN = 24  # suspects of each set in the page


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the label check found: for each set ("train", "validation") the examples it looked at
    and its suspects among them."""

    sets: dict[str, tuple[Gathered, Suspects]]
    class_names: tuple[str, ...]
    folds: int
    trained_features: bool  # the heads read the trained backbone's features (a job from scratch)
    seconds: float

    def name(self, label: int) -> str:
        return self.class_names[label] if 0 <= label < len(self.class_names) else str(label)

    def summary(self) -> str:
        return "; ".join(f"{name}: {len(found):,} of {len(seen):,} images suspected"
                         + (" (the first: the pass was cut short)" if seen.cut else "")
                         for name, (seen, found) in self.sets.items()) or "nothing to check"

    def rows(self):
        for name, (seen, found) in self.sets.items():
            for rank, (index, likely, given_p, likely_p) in enumerate(zip(
                    found.indices, found.likely, found.given_probability, found.likely_probability), 1):
                yield {"set": name, "rank": rank, "fingerprint": seen.fingerprints[index] if seen.fingerprints else "",
                       "given_label": self.name(int(seen.labels[index])), "likely_label": self.name(int(likely)),
                       "given_probability": round(float(given_p), 4), "likely_probability": round(float(likely_p), 4)}


def write(folder: Path, checked: Checked) -> Path:
    """label_errors.csv and label_errors.json; the CSV's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / JSON_NAME).write_text(json.dumps({
        "folds": checked.folds, "seconds": round(checked.seconds, 3),
        "train_features": "trained backbone" if checked.trained_features else "starting backbone",
        "sets": {name: {"examined": len(seen), "suspected": len(found), "cut": seen.cut}
                 for name, (seen, found) in checked.sets.items()}}, indent=1) + "\n")
    path = folder / CSV_NAME
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["set", "rank", "fingerprint", "given_label", "likely_label", "given_probability",
                                    "likely_probability"])
        writer.writeheader()
        writer.writerows(checked.rows())
    return path


def section(checked: Checked | None) -> str:
    title = "Labels to check first"
    if checked is None:
        return pages.section(title, pages.note(
            "not checked: set label_error_folds (5, say) to find the images whose labels are likely wrong"),
            anchor="labels")
    backbone = ("trained backbone (the job trained from scratch, or continued a previous model: these features "
                "have seen the labels, so fewer errors are found)" if checked.trained_features
                else "backbone the job started from")
    how = {"validation": "from the exported model's probabilities (it never trained on these images)",
           "train": (f"from {checked.folds} cross-validated heads on the features of the {backbone}, each head "
                     "predicting the images it did not fit on")}
    parts = [pages.note(
        "confident learning (Northcutt et al., 2021): how many labels are wrong is estimated by counting the images "
        "for which another class is as likely as that class's own images are on average; that many images, those "
        f"whose given label is least likely, are suspected, the least likely first. Every suspect is in {CSV_NAME}, "
        "by fingerprint.")]
    for name, (seen, found) in checked.sets.items():
        cut = " (the first: the pass was cut short)" if seen.cut else ""
        parts.append(f"<h3>{pages.escape(name.capitalize())} images: {len(found):,} of {len(seen):,}{cut}</h3>")
        parts.append(pages.note(how[name]))
        tiles = "".join(_tile(checked, seen, found, position) for position in range(min(MAX_SHOWN, len(found))))
        if tiles:
            parts.append(f'<div class="gallery">{tiles}</div>')
    return pages.section(title, *parts, anchor="labels")


def _tile(checked: Checked, seen: Gathered, found: Suspects, position: int) -> str:
    index = found.indices[position]
    given, likely = checked.name(int(seen.labels[index])), checked.name(int(found.likely[position]))
    text = "<br>".join(pages.escape(line) for line in (
        f"labelled: {given} ({found.given_probability[position]:.0%})",
        f"likely: {likely} ({found.likely_probability[position]:.0%})"))
    picture = pages.image(seen.thumbnails[index], "image/jpeg", f"image labelled {given}, likely {likely}") \
        if seen.thumbnails else ""
    return f'<div class="tile">{picture}{text}</div>'
