"""The code blocks of the project's Markdown documents, as tests/docs/test_docs.py runs them.

A fenced ```bash block is a list of commands (lines joined at a trailing backslash); a command that
cannot run in the tests says so where users read it, in a comment on its last line or on a comment
line just before it: `# ... (not tested here: REASON)` or `# not tested here: REASON`, REASON
beginning with one of REASONS (what the tests lack), then saying what exactly.
A fenced ```python block is a snippet, run as a script. An HTML comment just before a block, which
Markdown does not show, tells the tests what the block needs around it:

    <!-- doc-test: python sdk-v2 docker; environment pipe-channels train validation -->

  python sdk-v3 | sdk-v2          run with SageMaker SDK v3 (.venv) or v2 (.venv-sdk2)
  python same-request-as-previous-dry-run
                                  the CreateTrainingJob request it sends must be the one the
                                  document's previous `--dry-run` command printed
  python docker                   needs the tests' Docker Engine
  python save-as PATH             also written to PATH before anything runs (a user's train.py)
  environment pipe-channels C[:corrupt] ...
                                  run as a training script: a /opt/ml whose Pipe channels C are fed
                                  the built-in digits (or a stream with a damaged record)
  environment tfrecord-file PATH  a TFRecord file of the digits at PATH
  environment fresh-venv          the document's commands run in a new virtualenv (a user's own),
                                  first on PATH, where pip installs offline from the pinned
                                  requirements' wheels (`make test` downloads them) and nothing else

Nothing here does a step for the reader: what a user must do is a command in the document.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<text>.*?)\s*-->\s*$")
NOT_TESTED = re.compile(r"not tested here:\s*(?P<reason>[^)]*[^)\s])")
# What a command the tests cannot run may need, and they lack (every other command runs)
REASONS = ("needs AWS", "needs a GPU", "needs the internet", "takes longer than CI allows")


@dataclasses.dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    directives: dict[str, list[str]]

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


@dataclasses.dataclass
class Command:
    text: str
    line: int
    skip_reason: str | None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the document, with the directives of the comment just before it."""
    found, lines = [], path.read_text().splitlines()
    index, pending = 0, {}
    while index < len(lines):
        directive = DIRECTIVE.match(lines[index])
        fence = FENCE.match(lines[index])
        if directive:
            pending = parse_directives(directive.group("text"))
        elif fence:
            indent, start = fence.group("indent"), index
            index += 1
            body = []
            while index < len(lines) and lines[index].strip() != "```":
                body.append(lines[index][len(indent):] if lines[index].startswith(indent) else lines[index])
                index += 1
            found.append(Block(path, start + 1, fence.group("lang"), "\n".join(body) + "\n", pending))
            pending = {}
        elif lines[index].strip():
            pending = {}  # a directive belongs to the block right after it
        index += 1
    return found


def parse_directives(text: str) -> dict[str, list[str]]:
    """'python sdk-v2 docker; environment fresh-venv' -> {"python": [...], "environment": [...]}"""
    directives: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, *values = part.split()
        directives.setdefault(key, []).extend(values)
    return directives


def commands(block: Block) -> list[Command]:
    """The commands of a bash block; comment lines apply their marker to the next command."""
    found, pending_reason, parts, first = [], None, [], 0
    for number, line in enumerate(block.text.splitlines(), start=block.line + 1):
        stripped = line.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            marker = NOT_TESTED.search(stripped)
            if marker:
                pending_reason = marker.group("reason")
            continue
        if not parts:
            first = number
        parts.append(line)
        if line.rstrip().endswith("\\"):
            continue
        text = "\n".join(parts)
        marker = NOT_TESTED.search(text.splitlines()[-1])
        reason = marker.group("reason") if marker else pending_reason
        found.append(Command(text, first, reason))
        parts, pending_reason = [], None
    if parts:
        raise AssertionError(f"{block.where}: the block ends inside a command (a trailing backslash)")
    return found
