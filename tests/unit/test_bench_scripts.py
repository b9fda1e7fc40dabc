"""Every benchmark script answers `--help`, and the benchmarks index lists every study page.

The scripts import torch, Ray, vLLM and verl, which take ~10 s a process here, so one subprocess runs them all: each
script as `__main__` with `--help`, the way `python bench/<script>.py --help` runs it, in a process whose imports the
scripts share. A script that cannot import, or whose `--help` does not exit 0 with a usage line, fails its own case.
Ray, vLLM and verl are imported in that subprocess only, never in the unit tier's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(path.name for path in (ROOT / "bench").glob("*.py") if not path.name.startswith("_"))

# Run in the subprocess: argv is the results file, then the scripts; each runs with `--help` under `__main__`.
HELP_EACH = """
import contextlib, io, json, runpy, sys, traceback
results_file, scripts = sys.argv[1], sys.argv[2:]
sys.path.insert(0, "bench")  # as when a script is run from the repository root: its directory comes first
results = {}
for script in scripts:
    out, err = io.StringIO(), io.StringIO()
    code = "returned without exiting"
    sys.argv = [f"bench/{script}", "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(f"bench/{script}", run_name="__main__")
    except SystemExit as done:
        code = done.code or 0
    except BaseException:
        code = traceback.format_exc()
    results[script] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()[-2000:]}
with open(results_file, "w") as handle:
    json.dump(results, handle)
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, dict]:
    results = tmp_path_factory.mktemp("bench_help") / "results.json"
    done = subprocess.run([sys.executable, "-c", HELP_EACH, str(results), *SCRIPTS], capture_output=True, text=True,
                          timeout=120 + 10 * len(SCRIPTS), cwd=ROOT)
    assert done.returncode == 0 and results.exists(), f"the --help runner itself failed:\n{done.stderr[-4000:]}"
    return json.loads(results.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_answers_help(helps, script):
    result = helps[script]
    assert result["code"] == 0, f"bench/{script} --help: {result['code']}\n{result['stderr']}"
    assert "usage:" in result["stdout"], f"bench/{script} --help printed no usage:\n{result['stdout'][:2000]}"


def test_the_benchmarks_index_links_every_study_page():
    index = (ROOT / "docs" / "benchmarks.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("|")]
    linked = {match for row in rows for match in re.findall(r"\]\(benchmarks/([\w.-]+\.md)(?:#[\w-]*)?\)", row)}
    pages = {path.name for path in (ROOT / "docs" / "benchmarks").glob("*.md")}
    assert pages, "docs/benchmarks/ holds no page"
    assert not pages - linked, f"pages no row of the table in docs/benchmarks.md links: {sorted(pages - linked)}"
    assert not linked - pages, f"the index links pages that do not exist: {sorted(linked - pages)}"
