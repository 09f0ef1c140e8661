"""A page opened as a person's browser opens it: Debian's Chromium, headless (installed by
.ci/require), on a file:// URL. What it gives back: the console's messages (a page error, a
refused script, a Content-Security-Policy violation: any is a defect of ours), every request the
page itself made beyond its own file (from Chromium's net log: those whose network isolation key
is the file:// page's, not the browser's own background traffic), and a screenshot."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

from tests.timeouts import wait_s

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
         "--disable-default-apps", "--disable-extensions", "--password-store=basic",
         "--enable-logging=stderr", "--v=0"]
CONSOLE = re.compile(r":CONSOLE(?::\d+)?\] (.*)")


@dataclasses.dataclass
class Opened:
    console: list[str]
    requests: list[str]  # URLs the page asked for, besides file: and data: ones
    screenshot: Path


def open_page(page: Path, work: Path, width: int = 1200, height: int = 3000) -> Opened:
    assert CHROMIUM, "chromium is missing (.ci/require installs it)"
    work.mkdir(parents=True, exist_ok=True)
    shot, net = work / "screenshot.png", work / "net.json"
    out = subprocess.run([CHROMIUM, *QUIET, f"--user-data-dir={work / 'profile'}", f"--log-net-log={net}",
                          f"--screenshot={shot}", f"--window-size={width},{height}", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=wait_s(90))
    assert out.returncode == 0 and shot.is_file(), out.stderr[-3000:]
    console = [match.group(1) for match in map(CONSOLE.search, out.stderr.splitlines()) if match]
    return Opened(console, page_requests(net), shot)


def page_requests(net_log: Path) -> list[str]:
    """The URLs of the requests the page started (its own file and data: URIs aside)."""
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log["events"]:
        params = event.get("params") or {}
        if (event["type"] == start and str(params.get("network_isolation_key", "")).startswith("file://")
                and not params.get("url", "").startswith(("file:", "data:"))):
            urls.append(params["url"])
    return urls


def pixels(png: Path):
    """The screenshot as an array (height x width x channels)."""
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(png).convert("RGB"))


def painted(page: Path, work: Path, mime: str = "image/jpeg") -> tuple[int, int]:
    """(how many `mime` pictures the page holds, how many pixels of its screenshot they paint): the
    page against a copy of itself in which each is a blank picture of the same size. A picture that
    cannot be decoded, is hidden or is laid out off the page paints nothing."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    pattern = re.compile(rf"data:{re.escape(mime)};base64,([A-Za-z0-9+/=]+)")
    text = page.read_text(encoding="utf-8")

    def blank(match: re.Match) -> str:
        size = Image.open(io.BytesIO(base64.b64decode(match.group(1)))).size
        out = io.BytesIO()
        Image.new("RGB", size, "white").save(out, "JPEG" if mime == "image/jpeg" else "PNG")
        return f"data:{mime};base64,{base64.b64encode(out.getvalue()).decode()}"

    count = len(pattern.findall(text))
    blanked = work / f"blanked-{page.name}"
    blanked.write_text(pattern.sub(blank, text), encoding="utf-8")
    shown = pixels(open_page(page, work / "shown").screenshot)
    without = pixels(open_page(blanked, work / "blanked").screenshot)
    return count, int(np.any(shown != without, axis=-1).sum())
