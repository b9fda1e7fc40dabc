"""Pages rendered in a real browser: Debian's headless Chromium (`make setup-browser`), offline, its DOM after the
page's scripts ran."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

QUIET = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--metrics-recording-only"]


def render(page: Path, query: str = "") -> str:
    """`page` (with `query`, e.g. `?min-reward=1`) as headless Chromium leaves its DOM."""
    binary = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if binary is None:
        pytest.fail("no headless Chromium: run `make setup-browser` (CI runs it before these tests)")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([binary, *QUIET, f"--user-data-dir={profile}", "--headless", "--dump-dom",
                               page.as_uri() + query], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "</html>" in done.stdout, done.stderr[-3000:]
    return done.stdout


class Elements(HTMLParser):
    """Every element's tag and attributes, in document order."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, {name: value or "" for name, value in attrs}))

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [attrs for _, attrs in self.found if name in attrs.get("class", "").split()]
