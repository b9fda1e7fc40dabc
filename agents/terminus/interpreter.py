"""Where Terminus-2 runs: the harbor interpreter (Python >= 3.12) and what it is started with.

Owns: finding that interpreter (`TerminusConfig.harbor_python`, else `$FULLASYNC_HARBOR_PYTHON`, else
`<checkout>/.venv-harbor/bin/python` as `make setup-terminus` creates it) and saying exactly what is
missing when it is not there; the import path it gets (a directory of links to this installation's
`fullasync_agents` and `fullasync` packages, whose stdlib-only modules the harness side uses); the
harness's environment (litellm offline). Does not own: starting or stopping it (`ZygoteLauncher`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import fullasync
import fullasync_agents

HARBOR_VERSION = "0.24.0"
PYTHON_ENV = "FULLASYNC_HARBOR_PYTHON"
SETUP_HINT = (f"Terminus-2 runs in a Python >= 3.12 interpreter with harbor=={HARBOR_VERSION}: run `make "
              f"setup-terminus` in the fullasync checkout (creates .venv-harbor), or point {PYTHON_ENV} / "
              "agent.harbor_python at such an interpreter")


class HarborMissingError(RuntimeError):
    """The harbor interpreter is not there, or lacks harbor: a set-up problem, named with its fix."""


def checkout_root() -> Path:
    """The fullasync checkout this installation runs from (the `fullasync` package's parent)."""
    return Path(fullasync.__file__).resolve().parent.parent


def harbor_python(configured: str = "") -> Path:
    """The interpreter to run harbor with; HarborMissingError saying what is missing if there is none."""
    default = checkout_root() / ".venv-harbor" / "bin" / "python"
    candidate = Path(configured or os.environ.get(PYTHON_ENV, "") or default)
    if not candidate.exists():
        raise HarborMissingError(f"{candidate} does not exist. {SETUP_HINT}.")
    return candidate


def check_harbor(python: Path) -> None:
    """Raise HarborMissingError unless `python` is >= 3.12 and imports harbor at the pinned version."""
    probe = ("import sys, importlib.metadata as m; "
             "assert sys.version_info >= (3, 12), 'Python ' + sys.version.split()[0]; "
             "print(m.version('harbor'))")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarborMissingError(f"{python} cannot run harbor ({last}). {SETUP_HINT}.")
    if done.stdout.strip() != HARBOR_VERSION:
        raise HarborMissingError(f"{python} has harbor {done.stdout.strip()}, the adapter is tested with "
                                 f"{HARBOR_VERSION}. {SETUP_HINT}.")


def import_path(directory: Path) -> Path:
    """A directory that makes this installation's `fullasync_agents` and `fullasync` importable (symlinks)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, package in (("fullasync_agents", fullasync_agents), ("fullasync", fullasync)):
        link = directory / name
        if not link.exists():
            if package.__file__ is None:
                raise RuntimeError(f"{name} is not installed as a regular package (no __file__)")
            link.symlink_to(Path(package.__file__).resolve().parent, target_is_directory=True)
    return directory


def harness_environment(python_path: Path) -> dict[str, str]:
    """The harness's environment: ours, with only the links on PYTHONPATH and litellm kept off the network."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTHON", "VIRTUAL_ENV", "CONDA"))}
    env.update({
        "PYTHONPATH": str(python_path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "HF_HUB_OFFLINE": "1",
    })
    return env
