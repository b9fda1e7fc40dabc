"""The toy SWE task set: each bug of the catalog as a tiny stdlib-Python repository with an issue to fix.

Owns: the rows (train = the bug families in `TRAIN_FAMILIES`, held-out = `HELD_OUT_FAMILIES`, so a
held-out score measures transfer to kinds of bug never trained on), the repository files each row
carries (module, a visible failing test, a README), the hidden tests it is scored with, and the oracle
command that fixes it. Everything is generated deterministically from `catalog.py`; nothing touches
the network. Does not own: running a harness or the scoring process (`fullasync_agents.sandbox`).

A row is a plain dict, so users can bring their own repositories in the same shape:

    {"id": "operator-0", "instruction": "...",            # what the agent is told
     "files": {"calc/ops.py": "...", ...},                 # the repository (or "repo_dir": a path to copy)
     "hidden_tests": {"hidden_tests/test_hidden.py": "..."},  # written in only after the agent finished
     "test_command": ["{python}", "-m", "unittest", "-q", "hidden_tests/test_hidden.py"],  # exit 0 = solved
     "oracle_command": "sed -i ...", "family": "operator", "split": "train"}
"""

from __future__ import annotations

import shlex
from typing import Any

from fullasync_agents.swe_tasks.catalog import BUGS, HELD_OUT_FAMILIES, Bug

SPLITS = ("train", "held_out")
HIDDEN_TEST_FILE = "hidden_tests/test_hidden.py"
TEST_COMMAND = ("{python}", "-m", "unittest", "-q", HIDDEN_TEST_FILE)  # {python}: the scorer's interpreter


def _test_module(bug: Bug, class_name: str, assertions: tuple[str, ...]) -> str:
    module = bug.path[:-3].replace("/", ".")
    methods = "".join(f"    def test_{i}(self):\n        {line}\n\n" for i, line in enumerate(assertions))
    return (f"import unittest\n\nfrom {module} import {bug.function}\n\n\nclass {class_name}(unittest.TestCase):\n"
            f"{methods}\nif __name__ == '__main__':\n    unittest.main()\n")


def instruction(bug: Bug, hint: bool = True) -> str:
    """The issue the agent gets; with `hint`, it names the exact edit (what a tiny policy can learn to copy)."""
    text = f"Bug in {bug.path}: {bug.symptom}\nThe test tests/test_{bug.module} fails."
    if hint:
        text += f"\nHint: in {bug.path} replace `{bug.wrong}` with `{bug.right}`."
    return text


def oracle_command(bug: Bug) -> str:
    """The one shell command that fixes the bug."""
    return f"sed -i {shlex.quote(f's/{bug.wrong}/{bug.right}/')} {bug.path}"


def repository_files(bug: Bug) -> dict[str, str]:
    """The repository as the agent finds it: the buggy module, a failing visible test, a README."""
    return {
        "README.md": f"# {bug.package}\n\nRun the tests with `python -m unittest`.\n",
        f"{bug.package}/__init__.py": "",
        bug.path: bug.buggy_source,
        "tests/__init__.py": "",
        f"tests/test_{bug.module}": _test_module(bug, "VisibleTest", (bug.visible,)),
    }


def row(bug: Bug, index: int, hint: bool = True) -> dict[str, Any]:
    split = "held_out" if bug.family in HELD_OUT_FAMILIES else "train"
    return {
        "id": f"{bug.family}-{index}",
        "instruction": instruction(bug, hint),
        "files": repository_files(bug),
        "hidden_tests": {HIDDEN_TEST_FILE: _test_module(bug, "HiddenTest", (bug.visible, *bug.hidden))},
        "test_command": list(TEST_COMMAND),
        "oracle_command": oracle_command(bug),
        "family": bug.family,
        "split": split,
    }


def rows(split: str | None = None, hint: bool = True) -> list[dict[str, Any]]:
    """All rows of `split` ("train", "held_out", or None for both), in catalog order."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {SPLITS} or None")
    index: dict[str, int] = {}
    out = []
    for bug in BUGS:
        number = index[bug.family] = index.get(bug.family, -1) + 1
        task = row(bug, number, hint)
        if split is None or task["split"] == split:
            out.append(task)
    return out


def train_rows() -> list[dict[str, Any]]:
    """Rows of the training families (a `data.train_dataset` entry point)."""
    return rows("train")


def held_out_rows() -> list[dict[str, Any]]:
    """Rows of the held-out families (a `data.val_dataset` entry point)."""
    return rows("held_out")

