"""The terminal `settings` family: a config line set to the wrong value, the task naming the right one.

Owns: 200 generated harbor tasks (`setting_rows`: 160 train / 40 held-out, the made-up names of
`fullasync_agents.swe_tasks.settings`, so held-out names are in no training task and no warm-up
demonstration), written once as task directories under a cache folder named by their content's hash
(`tasks_dir`), and the one-line fix (`oracle_command`). `/app` holds `settings.ini` with
`mode=<wrong>` and `defaults.ini` with the same line; the tests want `settings.ini` to read
`mode=<right>` with its other lines kept and `defaults.ini` untouched. Rows have the shape of the
shipped task set's (`task_dir`, `extra_instructions`, `oracle_command`, `family`, `split`) plus `answer`.

Why this shape: the fix is one command in which only the right name varies,
`sed -i '/^mode/c mode=<right>' settings.ini` (sed's "change the line"), so a policy whose tokenizer holds
each name as one token (the Terminus warm-up adds them) fixes a task by copying one token from the hint — a
step a 2-layer model learns; the token before the name (`=`) occurs nowhere else in harbor's prompt (in
`s/^mode = .*/mode = <right>/` the tokens before the name also precede `.*`) — and what is left to learn
are habits (run the command: keystrokes end in a newline; edit settings.ini, not defaults.ini; act before
marking the task complete) that carry over from the training names to the held-out ones. The shipped 20
tasks (`rows`) need a whole command copied; they stay for bigger models.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fullasync_agents.swe_tasks.settings import HELD_OUT_TASKS, TASK_NAMES, TRAIN_TASKS
from fullasync_agents.terminal_tasks import SPLITS, TASKS_DIR, hint_for

FAMILY = "settings"
SETTINGS_FILE = "settings.ini"
DEFAULTS_FILE = "defaults.ini"
TASK_TOML = """schema_version = "1.4"

[metadata]
family = "settings"
split = "{split}"
oracle_command = {command}

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 30.0

[environment]
workdir = "/app"
network_mode = "no-network"
build_timeout_sec = 600.0
"""
TEST_SH = f"""#!/bin/bash
# Reward 1 iff /app/{SETTINGS_FILE} is the expected file (mode set, other lines kept) and
# /app/{DEFAULTS_FILE} is untouched; else 0.
if cmp -s /app/{SETTINGS_FILE} /tests/expected && cmp -s /app/{DEFAULTS_FILE} /tests/defaults; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
DOCKERFILE = (TASKS_DIR / "create-file" / "environment" / "Dockerfile").read_text()  # the shipped tasks' image


def mode_line(value: str) -> str:
    return f"mode={value}"


def settings_file(value: str) -> str:
    return f"[service]\nname=app\n{mode_line(value)}\nport=8080\n"


def oracle_command(right: str) -> str:
    return f"sed -i '/^mode/c {mode_line(right)}' {SETTINGS_FILE}"


def instruction(right: str) -> str:
    return (f"The service in /app reads its mode from /app/{SETTINGS_FILE}. Make its mode line read "
            f"`{mode_line(right)}`; leave /app/{DEFAULTS_FILE} as it is.")


def task_files(wrong: str, right: str, split: str) -> dict[str, str]:
    """One task's files, relative to its directory (scripts end in `.sh` and are made executable)."""
    command = oracle_command(right)
    return {
        "task.toml": TASK_TOML.format(split=split, command=json.dumps(command)),
        "instruction.md": instruction(right) + "\n",
        "environment/Dockerfile": DOCKERFILE,
        f"environment/app/{SETTINGS_FILE}": settings_file(wrong),
        f"environment/app/{DEFAULTS_FILE}": settings_file(wrong),
        "tests/test.sh": TEST_SH,
        "tests/expected": settings_file(right),
        "tests/defaults": settings_file(wrong),
        "solution/solve.sh": f"#!/bin/bash\nset -e\ncd /app\n{command}\n",
    }


def _tasks() -> list[tuple[str, str, dict[str, str]]]:
    out = []
    for index in range(TRAIN_TASKS + HELD_OUT_TASKS):
        split = "train" if index < TRAIN_TASKS else "held_out"
        out.append((f"settings-{index}", split, task_files(TASK_NAMES[2 * index], TASK_NAMES[2 * index + 1], split)))
    return out


def tasks_dir(tasks: list[tuple[str, str, dict[str, str]]], cache_dir: Path | None = None) -> Path:
    """The folder holding every task directory of `tasks` (`_tasks()`): `<cache>/terminal-tasks/settings-<hash of
    the content>`, written once (`cached_build`: atomic, so a half-written folder is never read; a changed
    generator gets a new folder)."""
    from fullasync.models import cached_build, default_cache_root

    digest = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()[:16]

    def write(staging: Path) -> dict[str, Any]:
        for name, _, files in tasks:
            for relative, text in files.items():
                path = staging / name / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                path.chmod(0o755 if path.suffix == ".sh" else 0o644)
        return {"tasks": len(tasks), "family": FAMILY}

    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return cached_build(root / "terminal-tasks" / f"settings-{digest}", write)


def setting_rows(split: str | None = None, hint: bool = True, cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """Rows of `split` ("train": 160, "held_out": 40 with names never in a training row, or None for both)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {SPLITS} or None")
    tasks = _tasks()
    root = tasks_dir(tasks, cache_dir)
    out = []
    for index, (name, task_split, _) in enumerate(tasks):
        if split is None or split == task_split:
            right = TASK_NAMES[2 * index + 1]
            out.append({"id": name, "task_dir": str(root / name), "instruction": instruction(right),
                        "extra_instructions": [hint_for(oracle_command(right))] if hint else [],
                        "oracle_command": oracle_command(right), "family": FAMILY, "split": task_split,
                        "answer": right})
    return out
