"""A job's label check, added to the data report of the dataset it trained on: the dataset's own
page (prepare's OUT/report.html) then lists the images whose labels the jobs trained on it suspect,
and names each job and where its page is.

    keras-pipe local ...                at the end of a job whose train channel is a prepare output
    keras-pipe report JOB               a SageMaker job: its train channel from DescribeTrainingJob
    keras-pipe report JOB --data OUT    any job, on the prepare output named

A prepare output: the train channel's folder (or S3 prefix), or the one above it, holds a
data_report.json (prepare writes OUT/train/, OUT/validation/ and OUT/data_report.json). The job's
check: its output/data/label_errors.json and .csv (keras_pipe_train.report.suspects); a job run
without label_error_folds has none, and nothing is added.

data_report.json gains "label_checks", newest first, at most MAX_CHECKS jobs (a job added again
replaces its own entry): the job's name, its page, when it was added (UTC), the folds, each set's
images examined and suspected, and the suspects as label_errors.csv lists them (the first
MAX_LISTED of each set). The page's section between data_report's markers is replaced, not the
page drawn again (the duplicates' pictures would have to be read again): a row for each job, and
the newest job's suspects with their pictures, read again from where prepare read them (a
suspect's source: its S3 URI, or its path under the source folder), and how many of the jobs
suspect each (an image that several jobs suspect is the likelier error).
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import datetime
import json
import os
import urllib.parse
from pathlib import Path

from keras_pipe_launch.prepare import data_report
from keras_pipe_launch.prepare.sources import Location, Reader
from keras_pipe_train.report import pages, suspects

MAX_CHECKS = 5  # the newest jobs' checks a data report keeps
MAX_LISTED = 1000  # suspects of each set kept in data_report.json (label_errors.csv has them all)
MAX_SHOWN = 24  # suspects of each set the page shows, with their pictures (as the job's page does)


class NotADataset(Exception):
    """The folder or prefix named as the job's data holds no data report of `keras-pipe prepare`."""


@dataclasses.dataclass(frozen=True)
class Added:
    page: str  # the data report's page, as a user reaches it (a path here, or an s3:// URI)
    suspects: int


class Dataset:
    """A prepare output's folder, here or in S3: its data report's two files, read and written."""

    def __init__(self, where: str):
        self.where = where.rstrip("/") if _in_s3(where) else where
        self._s3 = None

    @property
    def s3(self):
        """One S3 client for the dataset's reads and writes (a new one each call resolved the
        credentials and the endpoint again)."""
        if self._s3 is None:
            import boto3

            self._s3 = boto3.client("s3")
        return self._s3

    def read(self, name: str) -> str | None:
        """The file's text; None when it is not there."""
        if not _in_s3(self.where):
            path = Path(self.where) / name
            return path.read_text(encoding="utf-8") if path.is_file() else None
        from botocore.exceptions import ClientError

        bucket, key = self._key(name)
        try:
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def write(self, name: str, text: str, content_type: str) -> None:
        if not _in_s3(self.where):
            path = Path(self.where) / name
            temporary = path.with_name(f".{name}.writing")
            temporary.write_text(text, encoding="utf-8")
            os.replace(temporary, path)  # (a page open in a browser meanwhile is never half written)
            return
        bucket, key = self._key(name)
        self.s3.put_object(Bucket=bucket, Key=key, Body=text.encode("utf-8"), ContentType=content_type)

    def path(self, name: str) -> str:
        return f"{self.where}/{name}" if _in_s3(self.where) else str(Path(self.where) / name)

    def _key(self, name: str) -> tuple[str, str]:
        bucket, _, prefix = self.where[len("s3://"):].partition("/")
        return bucket, f"{prefix}/{name}" if prefix else name


def _in_s3(where: str) -> bool:
    return where[:5].lower() == "s3://"


def dataset_of(channel: str) -> Dataset | None:
    """The prepare output that the train channel `channel` is part of, if it is one: the channel's
    folder or prefix, or the one above it, holding prepare's data report."""
    if _in_s3(channel):
        parts = channel.rstrip("/").split("/")  # ("s3:", "", bucket, ...)
        candidates = ["/".join(parts[:n]) for n in (len(parts), len(parts) - 1) if n >= 3]
    else:
        folder = Path(channel) if Path(channel).is_dir() else Path(channel).parent
        candidates = [str(folder), str(folder.parent)]
    for where in dict.fromkeys(candidates):
        if dataset := dataset_at(where):
            return dataset
    return None


def dataset_at(where: str) -> Dataset | None:
    """The prepare output at `where` (a folder, or an S3 prefix), if it is one."""
    dataset = Dataset(where)
    return dataset if _report_in(dataset) is not None else None


def _report_in(dataset: Dataset) -> dict | None:
    text = dataset.read(data_report.JSON_NAME)
    try:
        report = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return report if isinstance(report, dict) and report.get("format") == data_report.FORMAT else None


def check_of(output_data: Path, job: str, page: str = "") -> dict | None:
    """The label check of the job whose output/data is `output_data`, as the data report keeps it;
    None when the job did not check its labels. `page`: the job's report page here, if it is here."""
    figures_file = output_data / suspects.JSON_NAME
    if not figures_file.is_file():
        return None
    figures = json.loads(figures_file.read_text(encoding="utf-8"))
    with open(output_data / suspects.CSV_NAME, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    kept = [row for name in dict.fromkeys(row["set"] for row in rows)
            for row in [r for r in rows if r["set"] == name][:MAX_LISTED]]
    listed = [{column: _value(column, row.get(column, "")) for column in suspects.CSV_COLUMNS} for row in kept]
    added = datetime.datetime.now(datetime.UTC).replace(tzinfo=None).isoformat(timespec="seconds")
    return {"job": job, "page": page, "added": added, "folds": figures.get("folds"), "sets": figures.get("sets", {}),
            **({"train_unchecked": figures["train_unchecked"]} if figures.get("train_unchecked") else {}),
            "suspects": listed}


def _value(column: str, text: str):
    if column == "rank":
        return int(text)
    return float(text) if column.endswith("_probability") else text


def with_check(report: dict, check: dict) -> dict:
    """The data report with `check` first among its label checks (an earlier one of the same job
    replaced), at most MAX_CHECKS kept."""
    others = [c for c in report.get("label_checks", []) if c.get("job") != check["job"]]
    return {**report, "label_checks": [check, *others][:MAX_CHECKS]}


def add(check: dict, dataset: Dataset, reader: Reader | None = None) -> Added:
    """Adds the job's `check` to `dataset`'s data report: its JSON, and its page's section."""
    report = _report_in(dataset)
    if report is None:
        raise NotADataset(f"{dataset.where} holds no {data_report.JSON_NAME} of keras-pipe prepare")
    report = with_check(report, check)
    page = dataset.read(data_report.HTML_NAME) or data_report.render(report, {})
    reader = reader or Reader()
    thumbnails = {s["source"]: _picture(s["source"], report["source"], reader) for s in _shown(check) if s["source"]}
    dataset.write(data_report.JSON_NAME, json.dumps(report, indent=1, ensure_ascii=False) + "\n", "application/json")
    page = spliced(page, section(report, thumbnails, dataset))
    dataset.write(data_report.HTML_NAME, page, "text/html; charset=utf-8")
    return Added(dataset.path(data_report.HTML_NAME), len(check["suspects"]))


def _shown(check: dict) -> list[dict]:
    by_set = collections.defaultdict(list)
    for suspect in check["suspects"]:
        by_set[suspect["set"]].append(suspect)
    return [s for found in by_set.values() for s in found[:MAX_SHOWN]]


def _picture(source: str, prepared_from: str, reader: Reader) -> bytes | None:
    """A suspect's thumbnail, read from where prepare read it; None when it cannot be read now."""
    location: Location
    if _in_s3(source):
        location = source
    elif Path(source).is_absolute() or _in_s3(prepared_from):
        location = Path(source)
    else:  # (prepare's dataset.recorded: a path under the source folder, a CSV's or a manifest's folder)
        base = Path(prepared_from)
        location = (base if base.is_dir() else base.parent) / source
    try:
        return data_report.thumbnail(reader.read(location))
    except Exception:  # (moved, deleted or unreachable since: the tile says where it was)
        return None


def spliced(page: str, new_section: str) -> str:
    """The page with its label checks' section replaced by `new_section` (before its end, for a
    page of a prepare that had no such section)."""
    start, end = page.find(data_report.CHECKS_START), page.find(data_report.CHECKS_END)
    wrapped = data_report.CHECKS_START + new_section + data_report.CHECKS_END
    if 0 <= start < end:
        return page[:start] + wrapped + page[end + len(data_report.CHECKS_END):]
    at = page.rfind("</body>")
    return page[:at] + wrapped + page[at:] if at >= 0 else page + wrapped


def section(report: dict, thumbnails: dict[str, bytes | None], dataset: Dataset) -> str:
    checks = report["label_checks"]
    suspected_by = collections.Counter(source for check in checks
                                       for source in {s["source"] for s in check["suspects"] if s["source"]})
    intro = pages.note(
        f"the images whose labels the jobs trained on this data found likely wrong (label_error_folds: confident "
        f"learning), the newest job first; each job's {suspects.CSV_NAME} lists all its suspects, and "
        f"{suspects.MANIFEST_NAME} those in S3, as a Ground Truth manifest to have them labelled again")
    rows = [(check["job"], check["added"].replace("T", " ") + " UTC",
             *(_counted(check, name) for name in ("train", "validation")), _where(check, dataset))
            for check in checks]
    parts = [intro, pages.table(["job", "added", "train suspects", "validation suspects", "the job's page"], rows)]
    links = [f'<a href="{pages.escape(urllib.parse.quote(where))}">{pages.escape(check["job"])}</a>'
             for check in checks if not (where := _where(check, dataset)).startswith("keras-pipe ")]
    if links:
        parts.append(f'<p>The jobs\' pages: {", ".join(links)}</p>')
    newest = checks[0]
    for name in dict.fromkeys(s["set"] for s in newest["suspects"]):
        found = [s for s in newest["suspects"] if s["set"] == name]
        title = f"{name.capitalize()} images that {newest['job']} suspects"
        parts.append(f"<h3>{pages.escape(title)}</h3>")
        tiles = "".join(_tile(s, thumbnails, suspected_by, len(checks)) for s in found[:MAX_SHOWN])
        parts.append(f'<div class="gallery">{tiles}</div>')
    if newest.get("train_unchecked"):
        parts.append(pages.note(f"{newest['job']} did not check its training images: {newest['train_unchecked']}"))
    return pages.section(data_report.CHECKS_TITLE, *parts, anchor="label-checks")


def _counted(check: dict, name: str) -> str:
    figures = check["sets"].get(name)
    if not figures:
        return "not checked"
    cut = " (cut short)" if figures.get("cut") else ""
    return f"{figures['suspected']:,} of {figures['examined']:,}{cut}"


def _where(check: dict, dataset: Dataset) -> str:
    """The job's page, relative to the data report's when both are here; else how to fetch it."""
    if check["page"] and not _in_s3(dataset.where):
        return Path(os.path.relpath(os.path.abspath(check["page"]), os.path.abspath(dataset.where))).as_posix()
    return f"keras-pipe report {check['job']}"


def _tile(suspect: dict, thumbnails: dict[str, bytes | None], suspected_by: collections.Counter, jobs: int) -> str:
    source = suspect["source"]
    lines = [f"labelled: {suspect['given_label']} ({suspect['given_probability']:.0%})",
             f"likely: {suspect['likely_label']} ({suspect['likely_probability']:.0%})",
             source or f"fingerprint {suspect['fingerprint']}"]
    if jobs > 1 and source:
        lines.append(f"suspected by {suspected_by[source]} of {jobs} jobs")
    picture = thumbnails.get(source) if source else None
    image = pages.image(picture, "image/jpeg", f"{source}: labelled {suspect['given_label']}") if picture else ""
    return f'<div class="tile">{image}' + "<br>".join(pages.escape(line) for line in lines) + "</div>"
