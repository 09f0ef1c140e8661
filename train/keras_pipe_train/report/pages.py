"""Self-contained HTML pages: the job's report (job_page.py) and prepare's data report.

A page is one file that opens from anywhere (output.tar.gz, a job folder, a download from S3) with
no network: its pictures are data: URIs, its style inline, and no script. Its Content-Security-Policy
says so to the browser too (default-src 'none'): a page that asked for anything outside itself would
get nothing, and a name from the data can never turn into markup (every text goes through escape).
"""

from __future__ import annotations

import base64
import html
import math
import warnings
from collections.abc import Iterable, Sequence

from keras_pipe_train.report.text import printable

POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1180px;
       padding: 0 20px 40px; color: #1f2328; background: #fff; }
h1 { font-size: 22px; margin: 22px 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #d0d7de;
  padding-bottom: 4px; }
.sub { color: #59636e; margin: 0 0 12px; }
table { border-collapse: collapse; margin: 6px 0 10px; } th, td { padding: 3px 10px; text-align: left;
  border-bottom: 1px solid #eaeef2; vertical-align: top; } th { background: #f6f8fa; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0; }
.card { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; min-width: 120px; }
.card b { display: block; font-size: 20px; } .card span { color: #59636e; font-size: 12px; }
figure { margin: 8px 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption, .note { color: #59636e; font-size: 12px; }
.gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 12px; }
.tile { border: 1px solid #d0d7de; border-radius: 6px; padding: 6px; font-size: 12px; overflow-wrap: anywhere; }
.tile img { width: 128px; height: 128px; object-fit: contain; display: block; margin: 0 auto 4px;
  image-rendering: pixelated; background: #f6f8fa; }
.tile:has(.heatmaps) { grid-column: span 2; }
.heatmaps { display: flex; gap: 4px; justify-content: center; } .heatmaps figure { margin: 0; text-align: center; }
.heatmaps img { width: 96px; height: 96px; image-rendering: auto; }
.bad { color: #cf222e; } .good { color: #1a7f37; }
details { margin: 6px 0; } summary { cursor: pointer; color: #0969da; }
"""


def pyplot():
    """matplotlib's pyplot on its Agg backend, with no display: the pictures of the pages and of
    evaluation.py are drawn into files and bytes only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A class name in a script the font lacks (猫) draws as boxes, and matplotlib warns once per glyph
    # on stderr: the tables beside each picture have the names, so the warnings say nothing useful
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font", category=UserWarning)
    return plt


def drawn(name: str, width: int) -> str:
    """A class name as a picture's label: its first `width` characters, control characters said
    (`\\x1b`, which the font has no glyph for), and `$` kept literal: matplotlib reads text between
    two dollars as TeX, and a name such as `$\\frac$` would otherwise fail the whole picture."""
    return printable(name[:width]).replace("$", r"\$")


def escape(value) -> str:
    return html.escape(str(value), quote=True)


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image(data: bytes, mime: str, alt: str, attributes: str = "") -> str:
    return f'<img src="{data_uri(data, mime)}" alt="{escape(alt)}"{attributes}>'


def with_heatmaps(picture: str, heatmaps, name) -> str:
    """A tile's `picture` (its <img>) beside its heatmaps ((what, class, JPEG) each: model/explain.py),
    each captioned "what: the class's `name`"."""
    if not heatmaps:
        return picture
    figures = "".join(f'<figure>{image(jpeg, "image/jpeg", f"heatmap of {what} {name(label)}")}'
                      f'<figcaption>{escape(f"{what}: {name(label)}")}</figcaption></figure>'
                      for what, label, jpeg in heatmaps)
    return f'<div class="heatmaps"><figure>{picture}<figcaption>as seen</figcaption></figure>{figures}</div>'


def number(value, digits: int = 4) -> str:
    """A metric as a table shows it: None or nan as a dash, a whole number as one."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1):
        return f"{int(value):,}"
    return f"{value:.{digits}f}"


def table(headers: Sequence[str], rows: Iterable[Sequence], numeric: Sequence[bool] | None = None) -> str:
    """Rows of already-formatted cells (escaped here); `numeric`: right-aligned columns."""
    numeric = numeric or [False] * len(headers)
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if n else ""}>{escape(cell)}</td>'
                                    for cell, n in zip(row, numeric)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def cards(items: Iterable[tuple[str, str]]) -> str:
    """Headline figures: (value, what it is)."""
    return '<div class="cards">' + "".join(f'<div class="card"><b>{escape(v)}</b><span>{escape(k)}</span></div>'
                                           for v, k in items) + "</div>"


def figure(png: bytes | None, caption: str) -> str:
    if png is None:
        return f'<p class="note">({escape(caption)}: no picture could be drawn)</p>'
    return f"<figure>{image(png, 'image/png', caption)}<figcaption>{escape(caption)}</figcaption></figure>"


def section(title: str, *parts: str, anchor: str = "") -> str:
    name = f' id="{escape(anchor)}"' if anchor else ""
    return f"<section{name}><h2>{escape(title)}</h2>{''.join(parts)}</section>"


def note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def heatmaps_note(drawn: int, shown: int, evidence_for: str, by: str) -> str:
    """What the heatmaps beside a gallery's `shown` pictures are, when `drawn` of them (the first) have
    them: for the worst mistakes (evidence for the class predicted) and the suspects (the likely class)."""
    which = "each" if drawn == shown else f"the first {drawn} (the rest past their time budget)"
    return note(f"beside {which}: where the model found the evidence for {evidence_for}, and for the label "
                f"(red most, blue none), by {by}")


def page(title: str, subtitle: str, sections: Iterable[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"sub\">{escape(subtitle)}</p>{''.join(sections)}</body></html>\n")
