"""Interpreters of their own: where an ecosystem whose pins clash with the project's (verifiers', OpenEnv's) runs.

Owns: finding such an interpreter (configured, else an environment variable, else `<checkout>/<venv>/bin/python` as
its make target creates it), saying exactly what is missing when it is not there, and the environment its
processes start with. Does not own: what runs there.
"""

from __future__ import annotations

import os
from pathlib import Path

import fullasync


def own_python(configured: str, variable: str, venv: str, hint: str, missing: type[Exception]) -> Path:
    """`configured`, else `$variable`, else `<checkout>/<venv>/bin/python`; `missing(... hint)` if it is not there."""
    default = Path(fullasync.__file__).resolve().parent.parent / venv / "bin" / "python"
    candidate = Path(configured or os.environ.get(variable, "") or default)
    if not candidate.exists():
        raise missing(f"{candidate} does not exist. {hint}.")
    return candidate


def foreign_environment() -> dict[str, str]:
    """Ours, without this interpreter's venv (the other's is its own); PYTHONPATH kept: where a user's own modules
    are. No progress bars (datasets' would fill a worker's log)."""
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    return env
