"""The likely label errors the job found (training/label_errors.py), as a person and a program read
them: output/data/label_errors.csv, every suspect, and the report page's section, the first
MAX_SHOWN of each set with their pictures.

    label_errors.csv    set (train or validation), rank (1: the given label least likely),
                        fingerprint (16 hex digits: tf.fingerprint of the encoded image, the same
                        for the same image bytes wherever they are), source (where the image came
                        from, when its Example says: sources/example.py's SOURCE_FEATURE, which
                        `keras-pipe prepare` writes), given_label, likely_label, given_probability,
                        likely_probability
    label_errors.manifest
                        the suspects whose source is an S3 URI, as a SageMaker Ground Truth
                        augmented manifest (JSON lines) in the form of an image classification
                        labeling job's output: source-ref, the given label under LABEL_ATTRIBUTE
                        and its -metadata, and what the check found under CHECK_ATTRIBUTE. The
                        input of a new labeling job that has people look at them again (Ground
                        Truth chains jobs on such manifests; docs/job.md says how).
    label_errors.json   the check's figures: folds, seconds, which features the training images'
                        heads read and their held-out accuracy (train_heads_accuracy: against
                        the labels given, the best guide to how many suspects are real), each
                        set's images examined (read, when they were a sample of more),
                        suspected and not judged (unjudged and unjudged_classes, when any:
                        their class too small, or not told apart; unreadable: probabilities
                        not numbers; training/label_errors.py), and how many suspects the
                        manifest holds
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
from pathlib import Path
from typing import TYPE_CHECKING

from keras_pipe_train.report import pages

if TYPE_CHECKING:  # (the launcher reads these files' names without TensorFlow: prepare/label_checks.py)
    from keras_pipe_train.training.gathered import Gathered
    from keras_pipe_train.training.label_errors import Suspects

CSV_NAME = "label_errors.csv"
JSON_NAME = "label_errors.json"
MANIFEST_NAME = "label_errors.manifest"
MAX_SHOWN = 24  # suspects of each set in the page
LABEL_ATTRIBUTE = "label"  # the manifest's label attribute (a labeling job's name, in Ground Truth's own)
CHECK_ATTRIBUTE = "label-check"  # what the check found, in the manifest


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the label check found: for each set ("train", "validation") the examples it looked at
    and its suspects among them."""

    sets: dict[str, tuple[Gathered, Suspects]]
    class_names: tuple[str, ...]
    folds: int
    trained_features: bool  # the heads read the trained backbone's features (a job from scratch)
    seconds: float
    unchecked: str = ""  # why the training images were not checked, when they were not
    heads_accuracy: float | None = None  # the training images' heads, on the images each held out
    validation_accuracy: float | None = None  # the model's, against the validation images' labels as given
    # each set's first MAX_SHOWN suspects' heatmaps ((what, class, JPEG) each: model/explain.py), and how
    # they were made; none where they were not (after_training/report_page.py)
    heatmaps: dict[str, list[tuple]] = dataclasses.field(default_factory=dict)
    explained_by: str = ""

    def name(self, label: int) -> str:
        return self.class_names[label] if 0 <= label < len(self.class_names) else str(label)

    def summary(self) -> str:
        return "; ".join(f"{name}: {len(found):,} of {len(seen):,} images suspected{_sample(seen)}"
                         for name, (seen, found) in self.sets.items()) or "nothing to check"

    def rows(self):
        """Each suspect, as the CSV has it (with the class ids, "given" and "likely", beside)."""
        for name, (seen, found) in self.sets.items():
            for rank, (index, likely, given_p, likely_p) in enumerate(zip(
                    found.indices, found.likely, found.given_probability, found.likely_probability), 1):
                given = int(seen.labels[index])
                yield {"set": name, "rank": rank, "fingerprint": seen.fingerprints[index] if seen.fingerprints else "",
                       "source": seen.sources[index] if seen.sources else "",
                       "given_label": self.name(given), "likely_label": self.name(int(likely)),
                       "given_probability": round(float(given_p), 4), "likely_probability": round(float(likely_p), 4),
                       "given": given, "likely": int(likely)}


CSV_COLUMNS = ("set", "rank", "fingerprint", "source", "given_label", "likely_label", "given_probability",
               "likely_probability")


def write(folder: Path, checked: Checked, job_name: str = "local") -> Path:
    """label_errors.csv, .manifest and .json; the CSV's path."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = list(checked.rows())
    in_s3 = [row for row in rows if row["source"][:5].lower() == "s3://"]
    (folder / JSON_NAME).write_text(json.dumps({
        "folds": checked.folds, "seconds": round(checked.seconds, 3),
        "train_features": "trained backbone" if checked.trained_features else "starting backbone",
        "sets": {name: {"examined": len(seen), "suspected": len(found), "cut": seen.cut,
                        **({"read": seen.read} if seen.sampled else {}),
                        **({"unjudged": found.unjudged} if found.unjudged else {}),
                        **({"unjudged_classes": [checked.name(c) for c in found.unjudged_classes]}
                           if found.unjudged_classes else {}),
                        **({"unreadable": found.unreadable} if found.unreadable else {})}
                 for name, (seen, found) in checked.sets.items()},
        **({"train_heads_accuracy": round(checked.heads_accuracy, 4)} if checked.heads_accuracy is not None else {}),
        **({"validation_model_accuracy": round(checked.validation_accuracy, 4)}
           if checked.validation_accuracy is not None else {}),
        **({"train_unchecked": checked.unchecked} if checked.unchecked else {}),
        "manifest": {"suspects": len(in_s3), "without_s3_source": len(rows) - len(in_s3)}}, indent=1) + "\n")
    path = folder / CSV_NAME
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    created = datetime.datetime.now(datetime.UTC).replace(tzinfo=None).isoformat()
    with open(folder / MANIFEST_NAME, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(manifest_line(row, job_name, created), ensure_ascii=False) + "\n" for row in in_s3)
    return path


def manifest_line(row: dict, job_name: str, created: str) -> dict:
    """A suspect as a line of an image classification labeling job's output manifest (Ground
    Truth's "Labeling job output data": the label, a class id, and its -metadata), its confidence
    the given label's probability; not annotated by a person."""
    return {
        "source-ref": row["source"],
        LABEL_ATTRIBUTE: row["given"],
        f"{LABEL_ATTRIBUTE}-metadata": {
            "class-name": row["given_label"], "confidence": row["given_probability"],
            "type": "groundtruth/image-classification", "job-name": f"keras-pipe-label-check/{job_name}",
            "human-annotated": "no", "creation-date": created},
        CHECK_ATTRIBUTE: {"set": row["set"], "rank": row["rank"], "likely-label": row["likely"],
                          "likely-class-name": row["likely_label"], "likely-confidence": row["likely_probability"],
                          "fingerprint": row["fingerprint"]},
    }


def section(checked: Checked | str | None) -> str:
    """The report's section: the check's suspects, or (a str) why there is no check."""
    title = "Labels to check first"
    if not isinstance(checked, Checked):
        return pages.section(title, pages.note(f"not checked: {checked or 'label_check=false'}"), anchor="labels")
    backbone = ("trained backbone (the job trained from scratch, or continued a previous model: these features "
                "have seen the labels, so fewer errors are found)" if checked.trained_features
                else "backbone the job started from")
    how = {"validation": "from the exported model's probabilities (it never trained on these images)"
                         + ("" if checked.validation_accuracy is None else
                            f"; the model chose the label given for {checked.validation_accuracy:.1%} of them (the "
                            "fewer, the more of the suspects are its own confident mistakes rather than wrong labels)"),
           "train": (f"from {checked.folds} cross-validated heads on the features of the {backbone}, each head "
                     "predicting the images it did not fit on"
                     + ("" if checked.heads_accuracy is None else
                        f"; on those, the heads chose the label given for {checked.heads_accuracy:.1%} of them "
                        "(the fewer, the less the suspects mean)"))}
    parts = [pages.note(
        "confident learning (Northcutt et al., 2021): how many labels are wrong is estimated by counting the images "
        "for which another class is as likely as that class's own images are on average; that many images, those "
        f"whose given label is least likely, are suspected, the least likely first. Every suspect is in {CSV_NAME}, "
        f"by fingerprint and source; those in S3 are in {MANIFEST_NAME}, a Ground Truth manifest to have them "
        "labelled again.")]
    for name, (seen, found) in checked.sets.items():
        parts.append(f"<h3>{pages.escape(name.capitalize())} images: {len(found):,} of {len(seen):,}"
                     f"{_sample(seen)}</h3>")
        parts.append(pages.note(how[name] + _unjudged(checked, found, len(seen))))
        tiles = "".join(_tile(checked, seen, found, position, checked.heatmaps.get(name))
                        for position in range(min(MAX_SHOWN, len(found))))
        drawn = sum(1 for heatmaps in checked.heatmaps.get(name, ())[:MAX_SHOWN] if heatmaps)
        if tiles and drawn:
            parts.append(pages.heatmaps_note(drawn, min(MAX_SHOWN, len(found)), "the likely class",
                                             checked.explained_by))
        if tiles:
            parts.append(f'<div class="gallery">{tiles}</div>')
    if checked.unchecked:
        parts.append(pages.note(f"Training images not checked: {checked.unchecked}."))
    return pages.section(title, *parts, anchor="labels")


def _sample(seen: Gathered) -> str:
    """Which images of the set were examined, when not all of it: a uniform sample (gathered.py)."""
    if seen.cut:
        return f" (a sample of the {seen.read or len(seen):,} read before the pass was cut short)"
    return f" (a sample of {seen.read:,})" if seen.sampled else ""


def _unjudged(checked: Checked, found: Suspects, examined: int) -> str:
    """What the check left out of a set: the images of classes too small or not learnt, and those
    whose probabilities were not numbers."""
    said = ""
    if found.unjudged:
        names = ", ".join(checked.name(c) for c in found.unjudged_classes[:10])
        more = f" and {len(found.unjudged_classes) - 10:,} more" if len(found.unjudged_classes) > 10 else ""
        said = (f". Not judged: {found.unjudged:,} images of {names}{more}, classes with fewer than the images it "
                "takes to judge one, or that the model does not tell apart (its probability of the class ranks "
                "their images above the others' less than 4 times in 5): their threshold would have made half the "
                "other images suspects"
                + ("; fewer than two classes were left to judge, so none was"
                   if found.unjudged + found.unreadable == examined else ""))
    if found.unreadable:
        said += (f". Left out: {found.unreadable:,} image{'' if found.unreadable == 1 else 's'} whose probabilities "
                 "are not numbers (NaN or infinite)")
    return said


def _tile(checked: Checked, seen: Gathered, found: Suspects, position: int, heatmaps: list | None) -> str:
    index = found.indices[position]
    given, likely = checked.name(int(seen.labels[index])), checked.name(int(found.likely[position]))
    lines = [f"labelled: {given} ({found.given_probability[position]:.0%})",
             f"likely: {likely} ({found.likely_probability[position]:.0%})"]
    if seen.sources and seen.sources[index]:
        lines.append(_short(seen.sources[index]))
    text = "<br>".join(pages.escape(line) for line in lines)
    picture = pages.image(seen.thumbnails[index], "image/jpeg", f"image labelled {given}, likely {likely}") \
        if seen.thumbnails else ""
    if picture and heatmaps and position < len(heatmaps):
        picture = pages.with_heatmaps(picture, heatmaps[position], checked.name)
    return f'<div class="tile">{picture}{text}</div>'


def _short(source: str, most: int = 40) -> str:
    """A source as a tile has room for: its end, the file's name, kept."""
    return source if len(source) <= most else "…" + source[-(most - 1):]
