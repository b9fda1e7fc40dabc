"""Where a verifiers environment runs: verifiers' own interpreter, and what the worker is started with.

Owns: finding that interpreter (`VerifiersSpec.python`, else `$FULLASYNC_VERIFIERS_PYTHON`, else
`<checkout>/.venv-verifiers/bin/python` as `make setup-verifiers` creates it), saying exactly what is missing when
it is not there, and the worker's environment. verifiers runs in an interpreter of its own because the Environments
Hub's environments pin verifiers 0.3.1, which needs `mcp<2` (the project's lock has mcp 2.3.0). Does not own:
starting the worker (`generator.py`) or listing rows (`rows.py`).
"""

from __future__ import annotations

from pathlib import Path

from fullasync_agents.interpreters import foreign_environment, own_python

PYTHON_ENV = "FULLASYNC_VERIFIERS_PYTHON"
WORKER = Path(__file__).with_name("worker.py")  # stdlib + verifiers only: runs in verifiers' interpreter
SETUP_HINT = ("verifiers environments run in an interpreter with verifiers 0.3.1 (and the environment's package): "
              f"run `make setup-verifiers` in the fullasync checkout (creates .venv-verifiers), or point {PYTHON_ENV} "
              "at such an interpreter")


class VerifiersMissingError(RuntimeError):
    """verifiers' interpreter is not there, or cannot load the environment: a set-up problem, named with its fix."""


def verifiers_python(configured: str = "") -> Path:
    """The interpreter to run environments with; VerifiersMissingError saying what is missing if there is none."""
    return own_python(configured, PYTHON_ENV, ".venv-verifiers", SETUP_HINT, VerifiersMissingError)


def worker_environment() -> dict[str, str]:
    """The worker's environment (`foreign_environment`)."""
    return foreign_environment()
