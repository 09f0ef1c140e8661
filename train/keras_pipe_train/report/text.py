"""Text from data nobody sanitised (file names, S3 keys, class names), as it can be printed, logged
or drawn: a control character (a terminal's escape code, a line break, one a font has no glyph for)
is said as Python writes it in a string (`\\x1b`, `\\n`), never sent."""

from __future__ import annotations


def printable(text: str, keep: str = "", limit: int | None = None) -> str:
    """`text` with each character that is not printable said, except those of `keep`; its first
    `limit` characters alone when given (cut before they are said, so a cut never splits one)."""
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text[:limit])
