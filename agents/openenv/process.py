"""An OpenEnv environment's server process for a run: openenv's own interpreter, the process, its port.

Owns: finding that interpreter (`OpenEnvSpec.python`, else `$FULLASYNC_OPENENV_PYTHON`, else
`<checkout>/.venv-openenv/bin/python` as `make setup-openenv` creates it; OpenEnv runs in an interpreter of its own:
it needs `mcp<2` and gradio, the project's lock has mcp 2.3.0), starting `server.py` there and reading its one
status line, whether it is alive, and stopping it (closing its input; killed if it does not end). A server that
does not start, or dies, is the infrastructure's failure (`OpenEnvServerError`), with the tail of its log. Does not
own: the episodes (`generator.py`, `session.py`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fullasync.errors import InfraError
from fullasync_agents.interpreters import foreign_environment, own_python

PYTHON_ENV = "FULLASYNC_OPENENV_PYTHON"
SERVER = Path(__file__).with_name("server.py")  # stdlib + uvicorn + openenv only: runs in openenv's interpreter
START_TIMEOUT_S = 300.0  # an environment may build what it needs when its package loads
SETUP_HINT = ("OpenEnv environments run in an interpreter with openenv 0.10.0 (and the environment's package): run "
              f"`make setup-openenv` in the fullasync checkout (creates .venv-openenv), or point {PYTHON_ENV} at such "
              "an interpreter")


class OpenEnvMissingError(RuntimeError):
    """openenv's interpreter is not there: a set-up problem, named with its fix."""


class OpenEnvServerError(InfraError):
    """The environment's server would not start, died, refused a session or lost one: the episode runs again
    (`rollout.infra_retries`), on a new server if this one is gone. The message names the server's log."""


def openenv_python(configured: str = "") -> Path:
    """The interpreter to serve environments with; OpenEnvMissingError saying what is missing if there is none."""
    return own_python(configured, PYTHON_ENV, ".venv-openenv", SETUP_HINT, OpenEnvMissingError)


class ServerProcess:
    """One server and where it listens."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path, ready: dict[str, object]) -> None:
        self.process = process
        self.log_path = log_path
        self.ready = ready
        self.url = f"ws://127.0.0.1:{ready['port']}/ws"

    @classmethod
    async def start(cls, python: Path, spec: dict[str, object], log_path: Path) -> ServerProcess:
        with open(log_path, "wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                str(python), str(SERVER), json.dumps(spec), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=stderr, env=foreign_environment())
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
        except BaseException:
            process.kill()
            await process.wait()
            raise
        status = json.loads(line) if line.strip() else {}
        if "ready" not in status:
            await process.wait()
            raise failure(process, log_path, f"did not start: {status.get('error', 'it exited')}")
        return cls(process, log_path, status["ready"])

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def failure(self, what: str) -> OpenEnvServerError:
        return failure(self.process, self.log_path, what)

    async def stop(self) -> None:
        if self.process.stdin is not None and self.process.returncode is None:
            self.process.stdin.close()  # the server ends at the end of its input
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def failure(process: asyncio.subprocess.Process, log_path: Path, what: str) -> OpenEnvServerError:
    tail = log_path.read_text(errors="replace").strip().splitlines()[-15:] if log_path.exists() else []
    return OpenEnvServerError(f"the OpenEnv server {what} (exit status {process.returncode}; its log {log_path}):\n"
                              + "\n".join(tail))
