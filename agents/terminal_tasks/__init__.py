"""The offline terminal task set: 20 tasks in harbor's task format, shipped as files in `harbor-tasks/`.

Owns: reading the tasks into rows. Each task directory is a harbor task — `task.toml` (its
`[metadata]` holds `family`, `split` and the one-line `oracle_command`), `instruction.md`,
`environment/` (`app/` = the files the agent starts with in /app; a `Dockerfile` on the local terminal image for
`environment_type=container`), `tests/test.sh` (writes 1 or 0 to /logs/verifier/reward.txt; no network) and
`solution/solve.sh` (runs the oracle command). Four families of five: `files`, `text`, `count` for
training, `select` held out. Every task is gated by `tests/integration/test_agents_terminal_tasks.py`: harbor's own
oracle agent scores 1, its no-op agent 0, in the local namespace sandbox. Does not own: running them.

A row is a plain dict, so users can bring their own harbor tasks in the same shape:

    {"id": "sort-lines", "task_dir": "/.../harbor-tasks/sort-lines", "instruction": "...",
     "extra_instructions": ["Hint: run `sort names.txt > sorted.txt` in /app."],   # appended by harbor
     "oracle_command": "sort names.txt > sorted.txt", "family": "text", "split": "train"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fullasync.data import harbor_task_row

TASKS_DIR = Path(__file__).resolve().parent / "harbor-tasks"
TRAIN_FAMILIES = ("files", "text", "count")
HELD_OUT_FAMILIES = ("select",)
SPLITS = ("train", "held_out")


def hint_for(oracle_command: str) -> str:
    """The extra instruction that names the command (what a tiny policy can learn to copy)."""
    return f"Hint: run `{oracle_command}` in /app."


def row(task_dir: Path, with_hint: bool = True) -> dict[str, Any]:
    """The task as `data.train_dataset=<folder>` reads it, with the hint when asked for."""
    found = harbor_task_row(task_dir)
    return {**found, "extra_instructions": [hint_for(str(found["oracle_command"]))] if with_hint else []}


def rows(split: str | None = None, hint: bool = True) -> list[dict[str, Any]]:
    """All rows of `split` ("train", "held_out", or None for both), sorted by task name."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {SPLITS} or None")
    found = [row(path.parent, hint) for path in sorted(TASKS_DIR.glob("*/task.toml"))]
    return [task for task in found if split is None or task["split"] == split]


def train_rows() -> list[dict[str, Any]]:
    """Rows of the training families (a `data.train_dataset` entry point)."""
    return rows("train")


def held_out_rows() -> list[dict[str, Any]]:
    """Rows of the held-out family (a `data.val_dataset` entry point)."""
    return rows("held_out")
