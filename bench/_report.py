"""What every benchmark does at its end: say how it was run, print its section and write it into its study's page
under docs/benchmarks/ between its markers (unless `--no-write`)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
STUDIES = DOCS / "benchmarks"  # one page per study, listed by the index docs/benchmarks.md and by mkdocs.yml


def command_line() -> str:
    """How this benchmark was started: `python bench/<script>.py <arguments>`."""
    return " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def run_note(started: float) -> str:
    """The command, its wall time since `started` (`time.perf_counter()`) and the load average at its end: what a
    figure depends on."""
    return (f"`{command_line()}` — {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f} at "
            "the end")


def write_section(markdown: Path, section: str, begin: str, end: str) -> None:
    """Replace the block between `begin` and `end` in `markdown` with `section` (appended when absent)."""
    text = markdown.read_text() if markdown.exists() else f"# {markdown.stem}\n"
    block = f"{begin}\n{section}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    markdown.write_text(text)


def study_page(begin: str) -> Path:
    """The page under docs/benchmarks/ that holds the marker `begin`; where none does, a new page named after it
    (`<!-- name:begin -->` -> name.md), which the index's table and mkdocs.yml's nav must then list (the unit test
    tests/unit/test_bench_scripts.py and the strict docs build fail until they do)."""
    for page in sorted(STUDIES.glob("*.md")):
        if begin in page.read_text():
            return page
    return STUDIES / f"{begin.removeprefix('<!-- ').split(':')[0]}.md"


def report(section: str, begin: str, end: str, write: bool, page: Path | None = None) -> None:
    """Print `section`; with `write`, put it between the markers `begin` and `end` of `page` (by default the study
    page holding them)."""
    print(section)
    if write:
        write_section(page or study_page(begin), section, begin, end)
