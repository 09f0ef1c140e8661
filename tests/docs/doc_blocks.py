"""The code blocks of the project's Markdown documents, as tests/docs/test_docs.py runs them.

A fenced ```bash block is a list of commands (lines joined at a trailing backslash); a fenced
```python block is a snippet, run as a script. HTML comments just before a block, which Markdown
does not show, tell the tests what the block needs around it, and which of its commands they
cannot run and why (a reader sees the commands and the document's own words, nothing of the tests):

    <!-- doc-test: python sdk-v2 docker; environment pipe-channels train validation -->
    <!-- doc-test: untested 2 takes longer than CI allows: it is the suite CI runs -->

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
  untested N REASON               the block's command N (from 1) is not run: REASON begins with one of
                                  REASONS (what the tests lack), then says what exactly (no ";")

Nothing here does a step for the reader: what a user must do is a command in the document.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<text>.*?)\s*-->\s*$")
UNTESTED = re.compile(r"^untested\s+(?P<number>\d+)\s+(?P<reason>.+)$")
# What a command the tests cannot run may need, and they lack (every other command runs)
REASONS = ("needs AWS", "needs a GPU", "needs the internet", "takes longer than CI allows")


@dataclasses.dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    directives: dict[str, list[str]]
    untested: dict[int, str] = dataclasses.field(default_factory=dict)  # command number (from 1): why not run

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
    index, pending, untested = 0, {}, {}
    while index < len(lines):
        directive = DIRECTIVE.match(lines[index])
        fence = FENCE.match(lines[index])
        if directive:  # (several comment lines in a row add up)
            found_directives, found_untested = parse_directives(directive.group("text"))
            for key, values in found_directives.items():
                pending.setdefault(key, []).extend(values)
            untested.update(found_untested)
        elif fence:
            indent, start = fence.group("indent"), index
            index += 1
            body = []
            while index < len(lines) and lines[index].strip() != "```":
                body.append(lines[index][len(indent):] if lines[index].startswith(indent) else lines[index])
                index += 1
            found.append(Block(path, start + 1, fence.group("lang"), "\n".join(body) + "\n", pending, untested))
            pending, untested = {}, {}
        elif lines[index].strip():
            pending, untested = {}, {}  # a directive belongs to the block right after it
        index += 1
    return found


def parse_directives(text: str) -> tuple[dict[str, list[str]], dict[int, str]]:
    """'python sdk-v2 docker; environment fresh-venv; untested 2 needs AWS: ...' ->
    ({"python": [...], "environment": [...]}, {2: "needs AWS: ..."})"""
    directives: dict[str, list[str]] = {}
    untested: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        if command := UNTESTED.match(part):
            untested[int(command.group("number"))] = command.group("reason")
            continue
        key, *values = part.split()
        directives.setdefault(key, []).extend(values)
    return directives, untested


def commands(block: Block) -> list[Command]:
    """The commands of a bash block, each with the reason it is not run (untested), or None."""
    found, parts, first = [], [], 0
    for number, line in enumerate(block.text.splitlines(), start=block.line + 1):
        stripped = line.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if not parts:
            first = number
        parts.append(line)
        if line.rstrip().endswith("\\"):
            continue
        found.append(Command("\n".join(parts), first, block.untested.get(len(found) + 1)))
        parts = []
    if parts:
        raise AssertionError(f"{block.where}: the block ends inside a command (a trailing backslash)")
    beyond = sorted(set(block.untested) - set(range(1, len(found) + 1)))
    if beyond:
        raise AssertionError(f"{block.where}: untested {beyond}: the block has {len(found)} commands")
    return found
