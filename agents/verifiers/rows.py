"""A verifiers environment's rows as a run's: its datasets listed by the worker (`worker.py rows`), each row kept
whole under `verifiers`, with an id and its task's name.

Owns: listing them (once, when the run is assembled; the environment loaded as the run's worker will load it) and
saying what is wrong when the environment cannot be loaded: the interpreter, the environment's package, its
arguments. Does not own: the episodes (`generator.py`).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from fullasync_agents.verifiers.generator import VerifiersSpec
from fullasync_agents.verifiers.interpreter import worker_environment

LIST_TIMEOUT_S = 900.0  # an environment may build its dataset when it loads

Row = dict[str, Any]  # {"id", "task", "verifiers": the environment's own row, as its dataset holds it}


def verifiers_rows(spec: VerifiersSpec) -> tuple[list[Row], list[Row], bool]:
    """The environment's training rows, its held-out rows (its eval dataset; none if it has none), and whether its
    rubric scores groups."""
    argv = spec.argv("rows")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=LIST_TIMEOUT_S, env=worker_environment())
    if done.returncode != 0:
        raise ValueError(f"data.task=verifiers:{spec.env_id}: the environment did not load in {argv[0]}: "
                         f"{_cause(done.stderr, spec, argv[0])}")
    rows: dict[str, list[Row]] = {"train": [], "eval": []}
    grouped = False
    for line in done.stdout.splitlines():
        record = json.loads(line)
        if "end" in record:
            grouped = bool(record["requires_group"])
            continue
        split = rows[record["split"]]
        split.append({"id": f"{spec.env_id}/{record['split']}/{len(split)}", "task": spec.env_id,
                      "verifiers": record["row"]})
    return rows["train"], rows["eval"], grouped


def _cause(stderr: str, spec: VerifiersSpec, python: str) -> str:
    lines = stderr.strip().splitlines() or ["no output"]
    last = lines[-1]
    module = spec.env_id.replace("-", "_").split("/")[-1]
    if f"No module named '{module}'" in stderr:
        return (f"{last.rstrip('.')}. Install the environment's package into that interpreter ({python} -m pip install "
                f"<its package>, or `prime env install {spec.env_id}` there), or put its module on PYTHONPATH")
    return "\n".join(lines[-12:])
