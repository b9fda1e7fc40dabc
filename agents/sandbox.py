"""Per-episode sandboxes for repository tasks: a private copy of the task's repository, and its scoring.

Owns: creating the episode's directory (`<tmp>/repo` holds the repository the agent edits), writing
a row's hidden tests in only after the agent has finished, running the row's `test_command` there
with a time limit (the whole process tree is killed at the limit), and the reward (exit status 0 = 1.0).
A test run that times out scores 0 (the agent's code hangs); a test command that cannot start at all
is an infrastructure failure and raises. Does not own: the task rows (`swe_tasks`) or the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullasync.errors import InfraError
from fullasync.rollout.processes import kill_tree


class SandboxError(RuntimeError):
    """The sandbox could not be built or scored: an infrastructure failure, never a reward of 0."""


@dataclass(frozen=True)
class Sandbox:
    """One episode's directory; `repo` is what the agent works in."""

    root: Path

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def create_sandbox(row: dict[str, Any], parent: str | None = None) -> Sandbox:
    """A fresh copy of the row's repository (`files` dict or `repo_dir` path) in a new temporary directory.

    A row that names no repository is the row's fault (`SandboxError`); a copy the machine cannot make (a full or
    unwritable disk) is the infrastructure's (`InfraError`: the episode runs again)."""
    if "repo_dir" not in row and "files" not in row:
        raise SandboxError(f"row {row.get('id')!r} has neither 'files' nor 'repo_dir': say what repository to copy")
    if "repo_dir" in row and not Path(row["repo_dir"]).is_dir():
        raise SandboxError(f"row {row.get('id')!r}: repo_dir {row['repo_dir']!r} is not a directory")
    try:
        sandbox = Sandbox(Path(tempfile.mkdtemp(prefix="fullasync-episode-", dir=parent)))
    except OSError as error:
        raise InfraError(f"row {row.get('id')!r}: no sandbox directory could be made under "
                         f"{parent or tempfile.gettempdir()}: {error}") from error
    try:
        if "repo_dir" in row:
            shutil.copytree(row["repo_dir"], sandbox.repo, symlinks=True)
        else:
            for name, content in row["files"].items():
                path = sandbox.repo / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            sandbox.repo.mkdir(exist_ok=True)
    except OSError as error:
        sandbox.remove()
        raise InfraError(f"row {row.get('id')!r}: its repository could not be copied into a sandbox: "
                         f"{error}") from error
    return sandbox


def _command(row: dict[str, Any]) -> list[str]:
    if not row.get("test_command"):
        raise SandboxError(f"row {row.get('id')!r} has no 'test_command' to score it with")
    return [part.replace("{python}", sys.executable) for part in row["test_command"]]


@dataclass(frozen=True)
class Finished:
    """How a bounded command ended: its exit status and output, or `timed_out` (it was killed, with its tree)."""

    returncode: int
    output: str
    timed_out: bool = False


async def run_bounded(argv: Sequence[str], timeout_s: float, *, cwd: Path | None = None,
                      env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> Finished:
    """`argv` on the host in a session of its own; at `timeout_s` its whole process tree is killed. OSError when it
    cannot start (the caller says whose fault that is). Its output goes to a file, not a pipe: a process it leaves
    running may hold a pipe open long after it ended (podman's conmon does, started from a Ray worker)."""
    with tempfile.TemporaryFile() as output:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=None if env is None else dict(env),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=output, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        try:
            await asyncio.wait_for(_fed(process, stdin), timeout_s)
        except TimeoutError:
            return Finished(-1, "", timed_out=True)
        finally:
            if process.returncode is None:
                kill_tree(process.pid)
                await process.wait()
        assert process.returncode is not None
        output.seek(0)
        return Finished(process.returncode, output.read().decode(errors="replace"))


async def _fed(process: asyncio.subprocess.Process, stdin: bytes | None) -> None:
    """`stdin` written to the process (and closed), then its end."""
    if stdin is not None and process.stdin is not None:
        process.stdin.write(stdin)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await process.stdin.drain()
        process.stdin.close()
    await process.wait()


async def score(row: dict[str, Any], sandbox: Sandbox, timeout_s: float = 60.0) -> float:
    """Write the hidden tests into the repository, run the test command; 1.0 if it exits 0, else 0.0."""
    for name, content in row.get("hidden_tests", {}).items():
        path = sandbox.repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    try:
        done = await run_bounded(_command(row), timeout_s, cwd=sandbox.repo, env=env)
    except OSError as error:
        raise SandboxError(f"row {row.get('id')!r}: its test_command could not start: {error}") from error
    return 1.0 if done.returncode == 0 and not done.timed_out else 0.0
