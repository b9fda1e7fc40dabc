"""The `settings` task family: one constant set to the wrong value, the issue naming the right one.

Owns: made-up names (`made_up_names`: lowercase letters, never a word of the task text), the rows
(`setting_rows`: `app/settings.py` holds `MODE = "<wrong>"`, the visible and hidden tests want
`"<right>"`), and the pool a warm-up may draw names from (`WARMUP_NAMES`, disjoint from every task's).
Rows have the shape of `tasks.py`'s, so the sandbox, the scorer and the harness adapters take them as
they are.

Why this shape: the fix is one short command in which only the right name varies,
`sed -i 's/^MODE = .*/MODE = "<right>"/' app/settings.py`, so a policy whose tokenizer holds each name
as one token (the examples' warm-ups add them) fixes a task by copying one token from the issue — a
step a 2-layer model learns — and what is left to learn are habits (edit the module, quote the value,
fix before submitting) that carry over from the training names to the held-out ones. The bug families
of `catalog.py` need ~30 tokens copied exactly; they stay for bigger models.
"""

from __future__ import annotations

import random
import shlex
from typing import Any

from fullasync_agents.swe_tasks.tasks import HIDDEN_TEST_FILE, SPLITS, TEST_COMMAND

PATH = "app/settings.py"
TEST_PATH = "tests/test_settings.py"
TRAIN_TASKS = 160
HELD_OUT_TASKS = 40
WARMUP_POOL = 1000
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def made_up_names(count: int, seed: int) -> list[str]:
    """`count` distinct three-syllable names (consonant + vowel each, e.g. "bokari"), deterministic in `seed`."""
    rng = random.Random(seed)
    names: dict[str, None] = {}
    while len(names) < count:
        names["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(3))] = None
    return list(names)


_NAMES = made_up_names(2 * (TRAIN_TASKS + HELD_OUT_TASKS) + WARMUP_POOL, seed=1729)
TASK_NAMES = _NAMES[: 2 * (TRAIN_TASKS + HELD_OUT_TASKS)]  # (wrong, right) pairs, train tasks first
WARMUP_NAMES = _NAMES[len(TASK_NAMES):]  # never in a task: a warm-up's demonstrations draw from these
ALL_NAMES = tuple(_NAMES)  # every name a policy's tokenizer should hold as one token


def assignment(value: str) -> str:
    return f'MODE = "{value}"'


def module_source(value: str) -> str:
    return f"{assignment(value)}\n\n\ndef mode():\n    return MODE\n"


def instruction(right: str, hint: bool = True) -> str:
    """The issue; with `hint` it names the right value (what a tiny policy copies), otherwise only the failing test
    says it."""
    text = f"Bug in {PATH}: mode() returns the wrong mode.\nThe test {TEST_PATH} fails."
    if hint:
        text += f"\nHint: in {PATH} the line should read `{assignment(right)}`."
    return text


def oracle_command(right: str) -> str:
    script = f"s/^MODE = .*/{assignment(right)}/"
    return f"sed -i {shlex.quote(script)} {PATH}"


def _test_module(class_name: str, right: str, hidden: bool) -> str:
    checks = [f'self.assertEqual(mode(), "{right}")']
    if hidden:
        checks += [f'self.assertEqual(settings.MODE, "{right}")', "self.assertIsInstance(mode(), str)"]
    methods = "".join(f"    def test_{i}(self):\n        {line}\n\n" for i, line in enumerate(checks))
    return (f"import unittest\n\nfrom app import settings\nfrom app.settings import mode\n\n\n"
            f"class {class_name}(unittest.TestCase):\n{methods}\nif __name__ == '__main__':\n    unittest.main()\n")


def setting_row(index: int, wrong: str, right: str, split: str, hint: bool = True) -> dict[str, Any]:
    return {
        "id": f"settings-{index}",
        "instruction": instruction(right, hint),
        "files": {"README.md": "# app\n\nRun the tests with `python -m unittest`.\n", "app/__init__.py": "",
                  PATH: module_source(wrong), "tests/__init__.py": "",
                  TEST_PATH: _test_module("VisibleTest", right, hidden=False)},
        "hidden_tests": {HIDDEN_TEST_FILE: _test_module("HiddenTest", right, hidden=True)},
        "test_command": list(TEST_COMMAND),
        "oracle_command": oracle_command(right),
        "family": "settings",
        "split": split,
        "answer": right,
    }


def setting_rows(split: str | None = None, hint: bool = True) -> list[dict[str, Any]]:
    """Rows of `split` ("train": 160, "held_out": 40 with names never in a training row, or None for both)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {SPLITS} or None")
    out = []
    for index in range(TRAIN_TASKS + HELD_OUT_TASKS):
        task_split = "train" if index < TRAIN_TASKS else "held_out"
        if split is None or split == task_split:
            out.append(setting_row(index, TASK_NAMES[2 * index], TASK_NAMES[2 * index + 1], task_split, hint))
    return out
