"""The note beside an exported policy: `fullasync_export.json` in a Hugging Face folder the run or
`fullasync export` wrote, naming the training step, the weight version and the base model (and the checkpoint
it came from, for an export). Owns only that file's shape."""

from __future__ import annotations

import json
from pathlib import Path

EXPORT_NOTE = "fullasync_export.json"


def write_export_note(target: Path, *, step: int, weight_version: int, base_model: str,
                      checkpoint: str | None = None) -> None:
    note = {"step": step, "weight_version": weight_version, "base_model": base_model}
    if checkpoint is not None:
        note = {"checkpoint": checkpoint, **note}
    (target / EXPORT_NOTE).write_text(json.dumps(note, indent=1) + "\n")
