"""Harnesses that are not in the project's lock, each in a venv of its own built from a lock file of its own
(`requirements/<name>-lock.txt`, installed with --no-deps) under `$FULLASYNC_CACHE_DIR/venvs`, once per lock file's
content; several test processes may ask at once (a file lock). Skips, saying why, only when pip cannot reach the
package index."""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from fullasync.models.tiny import default_cache_root

REQUIREMENTS = Path(__file__).parent.parent.parent / "requirements"
UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
               "Network is unreachable", "No matching distribution found")


def venv_python(name: str) -> Path:
    """The interpreter of the venv built from requirements/<name>-lock.txt."""
    lock = REQUIREMENTS / f"{name}-lock.txt"
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    venv = default_cache_root() / "venvs" / f"{name}-{digest}"
    python, stamp = venv / "bin" / "python", venv / ".fullasync-installed"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
            pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "-r", str(lock)],
                                 capture_output=True, text=True, timeout=600)
            if pip.returncode != 0:
                if any(sign in pip.stdout + pip.stderr for sign in UNREACHABLE):
                    pytest.skip(f"pip cannot reach the package index to build {venv}: "
                                f"{(pip.stderr.strip().splitlines() or ['no output'])[-1]}")
                raise RuntimeError(f"installing {lock} into {venv} failed:\n{pip.stderr[-2000:]}")
            stamp.touch()
    return python
