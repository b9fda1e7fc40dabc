"""`StartedContainerEnvironment`: a harbor environment over a task container fullasync started for the episode.

Runs inside the harbor interpreter (Python >= 3.12, `harbor` importable: `make setup-terminus`); harbor's `Trial`
builds it from `EnvironmentConfig(import_path="fullasync_agents.terminus.started_environment:
StartedContainerEnvironment", kwargs={"container_id": ..., "executable": ...})`. With `environment_type=container`
the generator starts the episode's container before the trial through `fullasync_agents.sandboxes` — on this host
(`placement=local`) or through the sandbox service of the Ray node with the most free places (`placement=cluster`):
the task's image built from its `environment/` directory, its repository cut at its base, no network, limits,
labels, the budgets, the warm pool — and removes (or resets) it after; this class only reaches it. Every command,
upload and download is one `<executable> exec`: this host's podman, or the relay's client, which runs it on the
container's node (`fullasync_agents.sandbox_relay`). Uploads go as a tar stream on stdin, downloads as a tar stream
in base64 (the relay carries text). Log directories are not mounted: harbor downloads `/logs/agent` and
`/logs/verifier` after each phase, as it does for a cloud sandbox. A relay or podman failure (exit 125 with its
message) raises `SandboxUnreachableError`, which the generator counts as an infrastructure failure (the episode
runs again, never scored).

Does not own: starting or removing the container (`Terminus2Generator` through `fullasync_agents.sandboxes`), the
agent, the verifier or the trial's lifecycle (harbor's).
"""

from __future__ import annotations

import asyncio
import base64
import shlex
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.tar_transfer import extract_dir_from_bytes, pack_dir_to_bytes

RELAY_FAILED = 125  # `podman exec`'s own failure (and the relay's) ...
RELAY_MESSAGES = ("fullasync sandbox relay", "Error")  # ... when its message starts so (a command may exit 125 too)
TRANSFER_TIMEOUT_S = 600


class SandboxUnreachableError(RuntimeError):
    """The task container could not be reached (podman, or the relay and the node's sandbox service): infra."""


class StartedContainerEnvironment(BaseEnvironment):
    """harbor's view of one running container, reached with `<executable> exec` (podman, or the sandbox relay)."""

    def __init__(self, *args: Any, container_id: str = "", executable: str = "", **kwargs: Any) -> None:
        if not container_id or not executable:
            raise ValueError("StartedContainerEnvironment needs container_id and executable (the generator gives both)")
        self._container = container_id
        self._executable = executable
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "fullasync-started"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """The image was built from environment/ (or named by the task) before the trial: nothing to check."""

    async def start(self, force_build: bool) -> None:
        await self._run(["true"], timeout_sec=60)  # reached, running
        await self.ensure_dirs(self._mount_targets(writable_only=True))  # /logs/agent, /logs/verifier, ...

    async def stop(self, delete: bool) -> None:
        """Nothing: the generator removes the container when the episode ends."""

    async def _run(self, command: list[str], options: tuple[str, ...] = (), timeout_sec: float | None = None,
                   stdin: bytes | None = None) -> ExecResult:
        """`<executable> exec <options> <container> <command>`; a relay or podman failure raises."""
        argv = [self._executable, "exec", *(("-i",) if stdin is not None else ()), *options, self._container, *command]
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(stdin), timeout_sec or None)
        except TimeoutError as error:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from error
        finally:
            if process.returncode is None:  # timed out or cancelled (through the relay: cancelled on its node too)
                process.kill()
                await process.wait()
        out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
        failed = process.returncode == RELAY_FAILED and (err or out).lstrip().startswith(RELAY_MESSAGES)
        if failed:
            raise SandboxUnreachableError(f"container {self._container[:12]}: {(err or out).strip()[-800:]}")
        return ExecResult(stdout=out or None, stderr=err or None, return_code=process.returncode)

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        options = ["-w", cwd or self.task_env_config.workdir or "/"]
        for key, value in (self._merge_env(env) or {}).items():
            options += ["-e", f"{key}={value}"]
        resolved = self._resolve_user(user)
        if resolved is not None:
            options += ["-u", str(resolved)]
        return await self._run(["bash", "-c", command], tuple(options), timeout_sec)

    async def _checked(self, what: str, command: str, stdin: bytes | None = None) -> str:
        done = await self._run(["sh", "-c", command], ("-u", "root"), TRANSFER_TIMEOUT_S, stdin)
        if done.return_code != 0:
            raise RuntimeError(f"{what} in the task container failed: {(done.stderr or done.stdout or '')[-500:]}")
        return done.stdout or ""

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = shlex.quote(target_path)
        await self._checked(f"writing {target_path}", f'mkdir -p "$(dirname {target})" && cat > {target}',
                            Path(source_path).read_bytes())

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        target = shlex.quote(target_dir)
        await self._checked(f"unpacking into {target_dir}", f"mkdir -p {target} && tar -C {target} -xf -",
                            pack_dir_to_bytes(source_dir).getvalue())

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        encoded = await self._checked(f"reading {source_path}", f"base64 < {shlex.quote(source_path)}")
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        Path(target_path).write_bytes(base64.b64decode(encoded))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        packed = (f'out=$(mktemp) && tar -C {shlex.quote(source_dir)} -cf "$out" . 2>"$out.err" && base64 < "$out"; '
                  'status=$?; [ $status = 0 ] || cat "$out.err"; rm -f "$out" "$out.err"; exit $status')  # one stream
        encoded = await self._checked(f"packing {source_dir}", packed)
        extract_dir_from_bytes(base64.b64decode(encoded), target_dir)
