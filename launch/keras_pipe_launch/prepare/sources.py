"""Where `keras-pipe prepare` finds labelled images: a local folder of class folders, a CSV of
path,label rows, or the same two in S3 (an s3:// prefix of class folders, an s3:// CSV). A CSV's
paths may be local paths (relative to the CSV) or s3:// URIs.

Listing gives names only (a few hundred bytes per image, whatever the images weigh); `read`
fetches one image's bytes when a worker needs them, so nothing is copied to local disk first.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from pathlib import Path, PurePosixPath

from keras_pipe_launch.common.manifests import entries, manifest_object, short
from keras_pipe_launch.common.objects import S3Store, SourceError, parse_s3_uri
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_train.settings.contract import is_hidden
from keras_pipe_train.sources import manifest_labels as labels_of

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp"}

Location = Path | str  # a local path, or an "s3://bucket/key" URI


class ListingError(ValueError):
    """The source cannot be listed as labelled images (not a per-image problem: those are rejected)."""


def suffix(location: Location) -> str:
    return PurePosixPath(str(location)).suffix.lower()


Labels = int | tuple[int, ...]  # a class id; or, multi-label, the image's class ids (maybe none)


@dataclasses.dataclass
class Listing:
    classes: list[str]
    items: list[tuple[Location, Labels]]  # (image, label), to be read
    rejected: list[tuple[Location, str]]  # (file, why), never read
    outside: list[str] = dataclasses.field(default_factory=list)  # files at the top, in no class folder: skipped
    # s3:// URI -> its ETag and size, for a listing of S3 objects: the same for two uploads of the
    # same bytes (an MD5 of them, or of their parts), known without reading either
    etags: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, classes: list[str], labelled: list[tuple[Location, Labels]], refused: list[tuple[Location, str]],
           outside: list[str] = (), etags: dict[str, str] | None = None):
        """Files that are not images by their name are rejected here, before anyone reads them."""
        items = [(where, label) for where, label in labelled if suffix(where) in IMAGE_SUFFIXES]
        rejected = refused + [(where, f"not an image file (suffix {shown(suffix(where)) or 'none'})")
                              for where, _ in labelled if suffix(where) not in IMAGE_SUFFIXES]
        return cls(classes, items, rejected, list(outside), dict(etags or {}))


def list_source(source: str, reader: Reader, multi_label: bool = False, label_attribute: str | None = None) -> Listing:
    """`multi_label`: the source is a CSV whose rows give each image any number of labels, or a
    multi-label Ground Truth manifest."""
    if source.lower().endswith(MANIFEST_SUFFIXES) or label_attribute:
        return list_manifest(source, reader, multi_label, label_attribute)
    is_csv = source.lower().endswith(".csv")
    if multi_label and not is_csv:
        raise ListingError(f"{shown(source)}: --multi-label reads a CSV of path,label,label,... rows (an image of "
                           "several classes cannot sit in one class folder)")
    if source.startswith("s3://"):
        return list_s3_csv(source, reader, multi_label) if is_csv else list_s3_prefix(source, reader)
    path = Path(source)
    if not path.exists():
        raise ListingError(f"{shown(path)} does not exist")
    if path.is_dir():
        return list_folder(path)
    if is_csv and path.is_file():
        with open(path, "rb") as f:
            return list_csv(f, str(path), lambda text: Path(os.path.normpath(path.parent / text)), multi_label)
    raise ListingError(f"{shown(path)} is neither a folder of class folders, a .csv file, nor an s3:// URI")


def _check_class_names(names: list[str], where: str) -> None:
    for name in names:
        if shown(name) != name:
            raise ListingError(f"class folder {where}{shown(name)}: its name must be printable UTF-8 text (the class "
                               "names become the model's outputs); rename it")
    if len(names) < 2:
        raise ListingError(f"{where} must hold one subfolder per class (at least two); found {len(names)}")


def list_folder(source: Path) -> Listing:
    """A folder of class folders. Symbolic links are followed only where they stay inside the
    source folder: a link out of it is listed as rejected, never read (a dataset is often shared by
    people who did not make it). Hidden files and folders are skipped, as are files at the top (in
    no class folder: named in the listing's `outside`)."""
    root = source.resolve()
    folders = sorted(p for p in source.iterdir() if p.is_dir() and not is_hidden([p.name]))
    _check_class_names([f.name for f in folders], f"{shown(source)}/")
    for folder in folders:
        if not folder.resolve().is_relative_to(root):
            raise ListingError(f"class folder {shown(folder)} is a symbolic link to {shown(folder.resolve())}, "
                               f"outside {shown(source)}: copy the images in, or give their folder as the source")
    items, refused = [], []
    for label, folder in enumerate(folders):
        for parent, subfolders, files in os.walk(folder, onerror=_unlistable):
            subfolders[:] = sorted(d for d in subfolders if not is_hidden([d]))
            for name in subfolders:
                if os.path.islink(os.path.join(parent, name)):
                    refused.append((Path(parent) / name, "a symbolic link to a folder (not followed)"))
            for name in sorted(f for f in files if not is_hidden([f])):
                path = Path(parent) / name
                if path.is_symlink() and not path.resolve().is_relative_to(root):
                    refused.append((path, f"a symbolic link to {shown(path.resolve())}, outside the source folder"))
                else:
                    items.append((path, label))
    outside = sorted(p.name for p in source.iterdir() if not p.is_dir() and not is_hidden([p.name]))
    return Listing.of([f.name for f in folders], items, refused, outside)


def _unlistable(err: OSError) -> None:
    # (os.walk skips a folder it cannot list, and its images with it, unless told otherwise)
    raise ListingError(f"cannot list {shown(err.filename)}: {err.strerror}")


def list_s3_prefix(source: str, reader: Reader) -> Listing:
    """An s3:// prefix of class folders, listed as the local folder is: the first part of each key
    after the prefix is its class; hidden parts are skipped, and keys at the top (in no class
    folder) too, named in the listing's `outside`."""
    store = S3Store(source if source.endswith("/") else source + "/", client=reader.s3)
    by_class: dict[str, list[str]] = {}
    outside = []
    etags = {}
    for obj in store.list():  # (keys relative to the prefix; folder markers left out)
        parts = obj.key.split("/")
        if len(parts) >= 2 and not is_hidden(parts):
            by_class.setdefault(parts[0], []).append(obj.location)
            if obj.etag:
                etags[obj.location] = f"{obj.etag} {obj.size}"
        elif not is_hidden(parts):
            outside.append(obj.key)
    classes = sorted(by_class)
    _check_class_names(classes, shown(store.uri))
    return Listing.of(classes, [(uri, label) for label, name in enumerate(classes) for uri in by_class[name]], [],
                      outside, etags)


def list_s3_csv(source: str, reader: Reader, multi_label: bool = False) -> Listing:
    """A CSV in S3; its relative paths are keys next to it (S3 keys are not paths: no normalising)."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = parse_s3_uri(source)
    folder = key.rpartition("/")[0]
    try:
        data = reader.read(source)
    except (BotoCoreError, ClientError) as err:
        raise SourceError(f"cannot read {shown(source)}: {shown(str(err))}") from None
    return list_csv(io.BytesIO(data), source,
                    lambda text: f"s3://{bucket}/{folder + '/' if folder else ''}{text}", multi_label)


def list_csv(data, name: str, relative_to, multi_label: bool = False) -> Listing:
    """path,label rows (multi_label: path,label,label,... with any number of labels, empty cells
    left out, as spreadsheets pad short rows); s3:// paths are used as they are, others go through
    `relative_to`. A path listed twice is an error (twice the weight, and maybe in both train and
    validation), so is an empty path or label, or a label given twice in a row. Labels are sorted
    (numerically when they are all numbers)."""
    rows: dict[Location, tuple[int, tuple[str, ...]]] = {}
    try:
        # utf-8-sig: Excel's "CSV UTF-8" starts with a byte-order mark, not part of the first cell
        for number, row in enumerate(csv.reader(io.TextIOWrapper(data, encoding="utf-8-sig", newline="")), 1):
            while len(row) > 2 and not row[-1].strip():  # (a spreadsheet pads short rows with empty cells)
                row = row[:-1]
            if not row or row[0].startswith("#"):
                continue
            if number == 1 and row[0].strip().lower() == "path" and [c.strip().lower() for c in row[1:]] in (
                    ["label"], ["labels"]) + ((["label"] * (len(row) - 1),) if multi_label else ()):
                continue  # a header
            text, labels = row[0].strip(), tuple(cell.strip() for cell in row[1:])
            if multi_label:
                labels = tuple(label for label in labels if label)
                if len(set(labels)) < len(labels):
                    raise ListingError(f"{shown(name)}:{number}: a label is given twice in {row}")
            elif len(row) != 2:
                raise ListingError(f"{shown(name)}:{number}: expected path,label; got {row}"
                                   + (" (for several labels per image, give --multi-label)" if len(row) > 2 else ""))
            if not text or not (multi_label or labels[0]):  # (multi-label: an image of none of the classes)
                raise ListingError(f"{shown(name)}:{number}: empty {'path' if not text else 'label'} in {row}")
            where = text if text.startswith("s3://") else relative_to(text)
            if where in rows:
                first, other = rows[where]
                said = ",".join(labels)
                again = f"again with label {said!r} (line {first}: {','.join(other)!r})" if other != labels else "again"
                raise ListingError(f"{shown(name)}:{number}: {shown(where)} is listed {again}; list each image once")
            rows[where] = (number, labels)
    except UnicodeDecodeError as err:
        raise ListingError(f"{shown(name)} is not UTF-8 text ({err.reason} at byte {err.start}): save it as "
                           "UTF-8") from None
    names = sorted({label for _, labels in rows.values() for label in labels},
                   key=lambda n: (len(n), n) if n.isdigit() else (0, n))
    if len(names) < 2:
        raise ListingError(f"{shown(name)} lists {len(names)} label(s); a classifier needs at least two")
    index = {label: i for i, label in enumerate(names)}
    if multi_label:
        items = [(where, tuple(sorted(index[label] for label in labels))) for where, (_, labels) in rows.items()]
    else:
        items = [(where, index[labels[0]]) for where, (_, labels) in rows.items()]
    return Listing.of(names, items, [])


MANIFEST_SUFFIXES = (".manifest", ".jsonl")
GROUND_TRUTH_TYPES = ("groundtruth/image-classification", "groundtruth/image-classification-multilabel")
MAX_CLASSES = 100_000


def list_manifest(source: str, reader: Reader, multi_label: bool = False, label_attribute: str | None = None
                  ) -> Listing:
    """A SageMaker Ground Truth output manifest (an augmented manifest): each line's source-ref and
    label, the classes named by the labels' metadata (class-name; class-map for multi-label).

    The label attribute is `label_attribute`, else the one attribute whose metadata says it is a
    Ground Truth image classification label. Refs are s3:// URIs, or in a local manifest paths
    relative to its folder (one leading out of it is rejected, never read). A line without a label
    (Ground Truth writes one for an image its workers failed to label, its metadata saying why) or
    with a label that is not a class id is rejected; a line that is not a JSON object, or an image
    listed twice, is an error naming the line."""
    manifest = manifest_object(source, reader.s3 if source.lower().startswith("s3:") else None)
    local_folder = None if source.lower().startswith("s3:") else Path(manifest.location).parent
    lines = list(entries(manifest))
    label_attribute = label_attribute or _label_attribute(lines, source)
    items: list[tuple[Location, Labels]] = []
    rejected: list[tuple[Location, str]] = []
    names: dict[int, str] = {}
    seen: dict[Location, str] = {}
    for _, where, entry in lines:
        location = _manifest_ref(entry.get("source-ref"), local_folder, where)
        if isinstance(location, tuple):  # (a ref that is rejected, and why)
            rejected.append(location)
            continue
        if location in seen:
            raise ListingError(f"{shown(where)}: {shown(location)} is listed again (first on {shown(seen[location])}); "
                               "list each image once")
        seen[location] = where
        metadata = entry.get(f"{label_attribute}-metadata")
        if label_attribute not in entry:
            reason = metadata.get("failure-reason") if isinstance(metadata, dict) else None
            rejected.append((location, f"{where}: no label {label_attribute!r}"
                             + (f" (Ground Truth: {shown(str(reason)[:200])})" if reason else "")))
            continue
        if isinstance(entry[label_attribute], list) and not multi_label:
            raise ListingError(f"{shown(where)}: label {label_attribute!r} is a list "
                               f"({shown(labels_of.short(entry[label_attribute]))}): for a multi-label manifest, give "
                               "--multi-label")
        try:
            ids = labels_of.class_ids(entry[label_attribute], label_attribute, multi_label)
            named = labels_of.metadata_names(metadata, f"{label_attribute}-metadata", ids) if metadata else {}
        except ValueError as err:
            rejected.append((location, f"{where}: {shown(str(err))}"))
            continue
        for label, name in named.items():
            if shown(name) != name:
                raise ListingError(f"{shown(where)}: the metadata's name of class {label} is not printable text")
            if names.setdefault(label, name) != name:
                raise ListingError(f"{shown(where)}: class {label} is called {shown(name)} in its metadata, but "
                                   f"{shown(names[label])} before")
        items.append((location, tuple(ids) if multi_label else ids))
    return Listing.of(_manifest_classes(source, items, names), items, rejected)


def _manifest_classes(source: str, items: list[tuple[Location, Labels]], names: dict[int, str]) -> list[str]:
    """The classes of a manifest's lines: 0 to the highest class id a label or the metadata holds,
    each called what the metadata calls it, else by its number."""
    ids_seen = {label for _, labels in items for label in (labels if isinstance(labels, tuple) else (labels,))}
    count = max(ids_seen | set(names), default=-1) + 1
    if count > MAX_CLASSES:
        raise ListingError(f"{shown(source)} has class id {count - 1}: more than {MAX_CLASSES} classes; class ids "
                           "count from 0")
    if count < 2:
        raise ListingError(f"{shown(source)} labels {count} class(es); a classifier needs at least two")
    classes = [names.get(i, str(i)) for i in range(count)]
    if len(set(classes)) < len(classes):
        raise ListingError(f"{shown(source)}: two classes have the same name in the metadata ({shown(str(classes))})")
    return classes


def _label_attribute(lines: list[tuple[int, str, dict]], source: str) -> str:
    """The label attribute: the one attribute whose metadata says it is a Ground Truth image
    classification label, in the first line that has one (a line Ground Truth could not label may
    lack it)."""
    for _, where, entry in lines:
        found = [name[:-len("-metadata")] for name, value in entry.items()
                 if name.endswith("-metadata") and isinstance(value, dict) and value.get("type") in GROUND_TRUTH_TYPES]
        if len(found) > 1:
            raise ListingError(f"{shown(where)}: {len(found)} Ground Truth image classification labels "
                               f"({shown(', '.join(found))}): give --label-attribute NAME")
        if found:
            return found[0]
    raise ListingError(f"{shown(source)}: no line has a Ground Truth image classification label's metadata, to tell "
                       "which attribute is the label: give --label-attribute NAME")


def _manifest_ref(ref, local_folder: Path | None, where: str) -> Location | tuple[Location, str]:
    if not isinstance(ref, str) or not ref:
        raise ListingError(f"{shown(where)}: source-ref must be a path or s3:// URI, got {short(ref)}")
    if ref.lower().startswith("s3:"):
        try:
            parse_s3_uri(ref)
        except SourceError as err:
            return ref, f"{where}: {err}"
        return ref
    if local_folder is None:
        return ref, f"{where}: not an s3:// URI (a manifest in S3 refers to images in S3)"
    path = Path(os.path.normpath(local_folder / ref))
    if not path.resolve().is_relative_to(local_folder.resolve()):
        return path, f"{where}: leads out of the manifest's folder"
    return path


class Reader:
    """Reads images (and CSVs) from local paths and S3, one S3 client for all threads (boto3's
    clients are thread-safe), with a connection for each."""

    def __init__(self):
        self._s3 = None

    @property
    def s3(self):
        if self._s3 is None:
            import boto3
            from botocore.config import Config

            self._s3 = boto3.client("s3", config=Config(max_pool_connections=64, retries={"mode": "standard"}))
        return self._s3

    def read(self, location: Location) -> bytes:
        """The bytes; OSError (local) or botocore's errors (S3) when unreadable."""
        if isinstance(location, Path):
            return location.read_bytes()
        # (not parse_s3_uri: that checks a prefix given by the user; a listed key may hold anything)
        bucket, _, key = location[len("s3://"):].partition("/")
        return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
