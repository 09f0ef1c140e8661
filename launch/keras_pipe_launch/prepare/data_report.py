"""What prepare found in the data, beside the dataset it wrote: OUT/data_report.json (every number
and every duplicate group, for programs) and OUT/report.html (for people: one self-contained page,
keras_pipe_train.report.pages).

    classes         each class's images in train and validation (class balance)
    sizes           the images' widths and heights: range, median, and how many by longer side
    duplicates      each group of images that are one picture (duplicates.py): "exact" (the same
                    file) or "near" (resized, recompressed), the part it went to whole, and whether
                    its images carry different labels (a label conflict, listed first). The part is
                    found from where each image went, not assumed: "both" would say a group was not
                    kept whole (counted in in_both_parts; 0, on one machine and at scale, where the
                    merge moves to train what the plan could not see: prepare.moves)

The page shows up to MAX_GROUPS_SHOWN groups with thumbnails (at most MAX_MEMBERS_SHOWN of each,
read again for it): bounded in size however large the dataset; the JSON lists them all.
"""

from __future__ import annotations

import io
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from keras_pipe_launch.prepare.duplicates import Fingerprint, Group
from keras_pipe_launch.prepare.sources import Labels, Location, shown
from keras_pipe_train.report import pages
from keras_pipe_train.settings.config import DEFAULT_MAX_PIXELS

JSON_NAME = "data_report.json"
HTML_NAME = "report.html"
FORMAT = "keras-pipe data report"
MAX_GROUPS_SHOWN = 40
MAX_MEMBERS_SHOWN = 6
THUMBNAIL = 112
BOTH = "both"  # a group's part when its images are in train and in validation
SIDES = (128, 256, 512, 1024, 2048)  # longer-side buckets: below 128, 128-255, ... 2048 and more
# the page's section of the jobs' label checks lies between these, replaced when a job's is added
# (label_checks.py: the page is not drawn again, so the duplicates' pictures need not be read again)
CHECKS_START, CHECKS_END = "<!-- label checks -->", "<!-- /label checks -->"
CHECKS_TITLE = "Labels the jobs suspect"


def name_of(location: Location, source: str) -> str:
    """An image as the report names it: its path under the source (a local folder's, or an S3 key's)."""
    text, base = str(location), str(source).rstrip("/") + "/"
    return text[len(base):] if text.startswith(base) else text


def label_names(labels: Labels, classes: list[str]) -> list[str]:
    return [classes[label] for label in (labels if isinstance(labels, tuple) else (labels,))]


def build(source: str, classes: list[str], items: list[tuple[Location, Labels]], prints: Sequence[Fingerprint | None],
          found: list[Group], parts: dict[str, str], counts: dict, rejected: int, distance: int | None,
          moved: frozenset[str] = frozenset()) -> dict:
    """The report's content. `parts`: each item's location (as a string) -> "train"/"validation";
    `counts`: part -> Counter of labels written; `distance`: None when duplicates were not looked for;
    `moved`: the locations of the validation images moved to train after the split (at scale:
    prepare.moves), their part in `parts` already train."""
    listed = [{"class": name, "train": counts["train"][label], "validation": counts["validation"][label]}
              for label, name in enumerate(classes)]
    groups = []
    for group in found:
        members = [{"image": name_of(items[i][0], source), "labels": label_names(items[i][1], classes)}
                   | ({"moved_from": "validation"} if str(items[i][0]) in moved else {}) for i in group.members]
        conflict = len({tuple(sorted(m["labels"])) for m in members}) > 1
        found_in = {parts[str(items[i][0])] for i in group.members if str(items[i][0]) in parts}
        groups.append({"kind": group.kind, "part": found_in.pop() if len(found_in) == 1 else BOTH if found_in else None,
                       "label_conflict": conflict, "members": members})
    groups.sort(key=lambda g: not g["label_conflict"])  # (conflicts first: they need a person)
    return {"format": FORMAT, "version": 1, "source": source, "images": len(items), "rejected": rejected,
            "classes": listed, "sizes": sizes(prints),
            "duplicates": {"looked_for": distance is not None, "distance": distance,
                           "exact_groups": sum(g["kind"] == "exact" for g in groups),
                           "near_groups": sum(g["kind"] == "near" for g in groups),
                           "images_in_groups": sum(len(g["members"]) for g in groups),
                           "label_conflicts": sum(g["label_conflict"] for g in groups),
                           "in_both_parts": sum(g["part"] == BOTH for g in groups), "moved_to_train": len(moved),
                           "groups": groups}}


def sizes(prints: Sequence[Fingerprint | None]) -> dict:
    measured = [(p.width, p.height) for p in prints if p is not None and p.width]
    if not measured:
        return {"measured": 0}
    widths, heights = [w for w, _ in measured], [h for _, h in measured]
    longer = [max(w, h) for w, h in measured]
    edges = (0, *SIDES, float("inf"))
    buckets = {(f"{low}-{high - 1}" if high != float("inf") else f"{low}+"): sum(low <= s < high for s in longer)
               for low, high in zip(edges, edges[1:])}
    return {"measured": len(measured),
            "width": {"min": min(widths), "median": statistics.median(widths), "max": max(widths)},
            "height": {"min": min(heights), "median": statistics.median(heights), "max": max(heights)},
            "longer_side": buckets}


def say(report: dict, page: str) -> None:
    """What the report found, on stderr, and where its page is (`page`, as the user reaches it)."""
    found = report["duplicates"]
    if found["groups"]:
        print(f"prepare: {len(found['groups'])} groups of duplicate images ({found['images_in_groups']} images; "
              f"{found['label_conflicts']} with different labels): each kept in one part, listed in the data report",
              file=sys.stderr)
    print(f"prepare: the data's report: {shown(page)} ({JSON_NAME} beside it)", file=sys.stderr)


def write(folder: Path, report: dict, thumbnails: dict[str, bytes | None]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / JSON_NAME).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / HTML_NAME).write_text(render(report, thumbnails), encoding="utf-8")


def shown_members(report: dict) -> list[str]:
    """The images the page shows a thumbnail of."""
    return [m["image"] for g in report["duplicates"]["groups"][:MAX_GROUPS_SHOWN]
            for m in g["members"][:MAX_MEMBERS_SHOWN]]


def thumbnail(data: bytes) -> bytes | None:
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > DEFAULT_MAX_PIXELS:  # (changed since it was fingerprinted: not decoded)
            return None
        image.draft("RGB", (THUMBNAIL, THUMBNAIL))
        image = image.convert("RGB")
        image.thumbnail((THUMBNAIL, THUMBNAIL))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=80)
        return out.getvalue()
    except Exception:  # (a file that changed or broke since it was read: shown without its picture)
        return None


def thumbnails_of(report: dict, read: Callable[[str], bytes]) -> dict[str, bytes | None]:
    found = {}
    for name in shown_members(report):
        try:
            found[name] = thumbnail(read(name))
        except Exception:  # (unreadable now: the page says so in its place)
            found[name] = None
    return found


def render(report: dict, thumbnails: dict[str, bytes | None]) -> str:
    duplicates = report["duplicates"]
    train = sum(c["train"] for c in report["classes"])
    validation = sum(c["validation"] for c in report["classes"])
    headline = pages.cards([(f"{report['images']:,}", "images listed"), (f"{train:,}", "in train"),
                            (f"{validation:,}", "in validation"), (f"{report['rejected']:,}", "rejected"),
                            (str(len(report["classes"])), "classes"),
                            (f"{duplicates['exact_groups']:,} / {duplicates['near_groups']:,}",
                             "exact / near duplicate groups"),
                            (f"{duplicates['label_conflicts']:,}", "label conflicts")])
    sections = [headline, duplicates_section(duplicates, thumbnails), no_label_checks(),
                balance_section(report["classes"]), sizes_section(report["sizes"])]
    return pages.page("Dataset report", f"keras-pipe prepare of {report['source']}", sections)


def duplicates_section(duplicates: dict, thumbnails: dict[str, bytes | None]) -> str:
    title = "Duplicates and label conflicts"
    if not duplicates["looked_for"]:
        return pages.section(title, pages.note("not looked for (--no-duplicate-check)"), anchor="duplicates")
    groups = duplicates["groups"]
    if not groups:
        return pages.section(title, pages.note(f"none: no two images are the same file, nor within "
                                               f"{duplicates['distance']} bits of each other's perceptual hash"),
                             anchor="duplicates")
    moved = duplicates["moved_to_train"]
    kept = "each was kept whole in one part, so no validation image is also a training image" + (
        f" ({moved:,} validation images were moved to train, duplicates of training images that the instances' "
        "fingerprints showed after the split)" if moved else "")
    intro = pages.note(f"{len(groups):,} groups of images that are one picture ({duplicates['images_in_groups']:,} "
                       f"images): {kept}. Exact: the same file; near: perceptual hashes within "
                       f"{duplicates['distance']} of 64 bits (resized, recompressed). Label conflicts first: the same "
                       "picture under different labels.")
    tiles = "".join(_group_tile(group, thumbnails) for group in groups[:MAX_GROUPS_SHOWN])
    more = (pages.note(f"the first {MAX_GROUPS_SHOWN} of {len(groups):,} groups: {JSON_NAME} lists them all")
            if len(groups) > MAX_GROUPS_SHOWN else "")
    return pages.section(title, intro, f'<div class="gallery">{tiles}</div>', more, anchor="duplicates")


def _group_tile(group: dict, thumbnails: dict[str, bytes | None]) -> str:
    verdict = ('<span class="bad">label conflict</span>' if group["label_conflict"]
               else f'<span class="good">{pages.escape(group["kind"])} duplicates</span>')
    where = ('<span class="bad">in train and validation</span>' if group["part"] == BOTH
             else f"kept in {pages.escape(group['part'] or '–')}")
    parts = [f"{verdict} · {where}"]
    for member in group["members"][:MAX_MEMBERS_SHOWN]:
        picture = thumbnails.get(member["image"])
        moved = " (moved from validation)" if member.get("moved_from") else ""
        parts.append((pages.image(picture, "image/jpeg", member["image"]) if picture else "")
                     + pages.escape(f"{member['image']}: {', '.join(member['labels']) or 'no label'}{moved}"))
    if len(group["members"]) > MAX_MEMBERS_SHOWN:
        parts.append(pages.escape(f"and {len(group['members']) - MAX_MEMBERS_SHOWN} more"))
    return '<div class="tile">' + "<br>".join(parts) + "</div>"


def no_label_checks() -> str:
    """The label checks' section before any job's is added (label_checks.py replaces it)."""
    return CHECKS_START + pages.section(CHECKS_TITLE, pages.note(
        "none yet: a job trained on this data with label_error_folds (5, say) lists here the images whose labels are "
        "likely wrong, when `keras-pipe local` ends it or `keras-pipe report JOB` fetches its report"),
        anchor="label-checks") + CHECKS_END


def balance_section(classes: list[dict]) -> str:
    total = sum(c["train"] + c["validation"] for c in classes) or 1
    rows = [(c["class"], pages.number(c["train"]), pages.number(c["validation"]),
             f"{(c['train'] + c['validation']) / total:.1%}") for c in classes]
    counts = [c["train"] + c["validation"] for c in classes]
    spread = pages.note(f"the largest class has {max(counts) / max(min(counts), 1):.1f}x the images of the smallest"
                        if counts else "no class")
    return pages.section("Class balance", spread, pages.figure(_balance_picture(classes), "images per class"),
                         pages.table(["class", "train", "validation", "share"], rows, [False, True, True, True]),
                         anchor="classes")


def _balance_picture(classes: list[dict]) -> bytes | None:
    try:
        plt = pages.pyplot()
        shown = classes[:60]
        figure, axis = plt.subplots(figsize=(9, max(2.0, 0.28 * len(shown) + 1)))
        names = [pages.drawn(c["class"], 30) for c in shown]
        axis.barh(names, [c["train"] for c in shown], label="train")
        axis.barh(names, [c["validation"] for c in shown], left=[c["train"] for c in shown], label="validation")
        axis.invert_yaxis()
        axis.set_xlabel("images" + (f" (the first 60 of {len(classes)} classes)" if len(classes) > 60 else ""))
        axis.legend()
        figure.tight_layout()
        out = io.BytesIO()
        figure.savefig(out, format="png", dpi=90)
        plt.close(figure)
        return out.getvalue()
    except Exception:  # (a convenience: the table below has the numbers)
        return None


def sizes_section(found: dict) -> str:
    title = "Image sizes"
    if not found.get("measured"):
        return pages.section(title, pages.note("no image's size could be read"), anchor="sizes")
    rows = [(axis, pages.number(found[axis]["min"]), pages.number(found[axis]["median"]),
             pages.number(found[axis]["max"])) for axis in ("width", "height")]
    buckets = [(name, pages.number(count)) for name, count in found["longer_side"].items()]
    return pages.section(title, pages.note(f"of {found['measured']:,} images, in pixels as stored in the source"),
                         pages.table(["", "smallest", "median", "largest"], rows, [False, True, True, True]),
                         pages.table(["longer side (px)", "images"], buckets, [False, True]), anchor="sizes")
