"""`TaskContainerEnvironment`: harbor's own podman environment with fullasync's container policy, for the tasks
whose environment is a docker-compose file (several services); a single-image task's container is started by
`fullasync_agents.sandboxes` instead and reached with `started_environment`.

Runs inside the harbor interpreter (Python >= 3.12, `harbor` and podman-compose installed: `make setup-terminus`);
harbor's `Trial` builds it from `EnvironmentConfig(import_path="fullasync_agents.terminus.container_environment:
TaskContainerEnvironment", kwargs={...})`. harbor builds the task's `environment/Dockerfile` and runs it with
podman-compose exactly as `environment_type=podman` does; this class only adds, through one compose overlay written
next to the trial (`fullasync-overlay.json`, merged last, so it wins):

- **no network** for the task container (`network_mode: none`) whatever the task asks: nothing but the host's
  loopback exists here, and the agent (Terminus-2) runs on the host, reaching the gateway there. harbor's
  `no-network` and `allowlist` modes start an egress-control side container pulled from a registry, so harbor is
  told the task is `public` and the overlay removes the network instead. Builds use the host's network.
- `init: true` (a `sleep` as PID 1 ignores SIGTERM) and the limits of `ContainerSettings` (memory, pids, cpus);
- the labels every fullasync container carries (`fullasync.managed`, `.owner`, `.episode`), so the episode's
  generator removes what an episode left (a hard kill at the episode timeout) and the next run sweeps what a
  SIGKILLed run left;
- a cap on trials starting at once across the harness's forked processes (`max_starting` lock files in
  `slots_dir`): a burst of episodes does not start every container at once;
- commands and uploads go to the started container with `podman exec` / `podman cp` rather than through a
  podman-compose process each (podman 4.3 has no `podman compose`; podman-compose 1.6 has no `cp`, and each of its
  calls re-reads every compose file: ~7 s a command against ~1.5 s for `podman exec` with both cores busy). Terminus-2
  drives tmux with a command per keystroke batch and screen read, so this is most of an episode's wall time.

Does not own: the agent, the verifier or the trial's lifecycle (harbor's), nor removing containers after a kill
(`Terminus2Generator`, with `fullasync_agents.containers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from harbor.environments.base import ExecResult
from harbor.environments.docker.docker import _sanitize_docker_compose_project_name
from harbor.environments.podman import PodmanEnvironment
from harbor.models.task.config import NetworkMode, NetworkPolicy

OVERLAY = "fullasync-overlay.json"
SLOT_POLL_S = 0.2


def overlay(container: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """The compose overlay for harbor's `main` service (JSON is YAML)."""
    return {"services": {"main": {
        "network_mode": container.get("network", "none"), "init": True,
        "mem_limit": container.get("memory", "2g"), "pids_limit": int(container.get("pids", 512)),
        "cpus": float(container.get("cpus", 1.0)), "labels": dict(labels),
        "build": {"network": "host"},
    }}}


@contextlib.asynccontextmanager
async def start_slot(slots_dir: Path, slots: int) -> AsyncIterator[None]:
    """One of `slots` start slots shared by every process using `slots_dir` (an exclusive lock on a file)."""
    slots_dir.mkdir(parents=True, exist_ok=True)
    files = [open(slots_dir / f"slot-{index}", "a") for index in range(slots)]
    held = None
    try:
        while held is None:
            for file in files:
                try:
                    fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held = file
                break
            else:
                await asyncio.sleep(SLOT_POLL_S)
        yield
    finally:
        for file in files:
            file.close()  # closing releases the lock


class TaskContainerEnvironment(PodmanEnvironment):
    """harbor's podman environment with no network, an init, limits, labels and a cap on concurrent starts."""

    def __init__(self, *args: Any, container: Mapping[str, Any] | None = None,
                 labels: Mapping[str, str] | None = None, slots_dir: str = "", **kwargs: Any) -> None:
        container = dict(container or {})
        path = Path(kwargs["trial_paths"].trial_dir) / OVERLAY  # harbor passes every argument by name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(overlay(container, labels or {}), indent=1))
        kwargs["extra_docker_compose"] = [*(kwargs.get("extra_docker_compose") or []), path]  # merged last: wins
        kwargs["network_policy"] = NetworkPolicy(network_mode=NetworkMode.PUBLIC)  # the overlay removes the network
        kwargs["phase_network_policies"] = ()
        super().__init__(*args, **kwargs)
        self._slots_dir = Path(slots_dir) if slots_dir else None
        self._max_starting = int(container.get("max_starting", 4))

    async def start(self, force_build: bool) -> None:
        self._container = ""
        if self._slots_dir is None:
            await super().start(force_build)
        else:
            async with start_slot(self._slots_dir, self._max_starting):
                await super().start(force_build)
        self._container = await self._main_container()

    async def _main_container(self) -> str:
        """The id of the `main` service's container in this trial's compose project."""
        project = _sanitize_docker_compose_project_name(self.session_id)
        done = await self._engine(["ps", "-aq", "--filter", f"label=com.docker.compose.project={project}",
                                   "--filter", "label=com.docker.compose.service=main"], timeout_sec=60)
        ids = (done.stdout or "").split()
        if done.return_code != 0 or len(ids) != 1:
            raise RuntimeError(f"podman found {len(ids)} main containers of compose project {project!r} "
                               f"(want one): {(done.stdout or '')[-500:]}")
        return ids[0]

    async def _engine(self, argv: list[str], timeout_sec: int | None = None,
                      stdin_data: bytes | None = None) -> ExecResult:
        process = await asyncio.create_subprocess_exec(
            *type(self)._engine_cmd(*argv), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL)
        return await self._collect_buffered_output(process, timeout_sec=timeout_sec, stdin_data=stdin_data)

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        if not getattr(self, "_container", ""):
            return await super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        argv = ["exec", "-w", cwd or self.task_env_config.workdir or "/"]
        for key, value in (self._merge_env(env) or {}).items():
            argv += ["-e", f"{key}={value}"]
        resolved = self._resolve_user(user)
        if resolved is not None:
            argv += ["-u", str(resolved)]
        return await self._engine([*argv, self._container, "bash", "-c", command], timeout_sec)

    async def _copy_in(self, source: str, target: str) -> None:
        done = await self._engine(["cp", source, f"{self._container}:{target}"], timeout_sec=600)
        if done.return_code != 0:
            raise RuntimeError(f"podman cp {source} -> {target} failed: {done.stdout or ''}{done.stderr or ''}")

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        if not getattr(self, "_container", ""):
            return await super().upload_file(source_path, target_path)
        await self._copy_in(str(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        if not getattr(self, "_container", ""):
            return await super().upload_dir(source_dir, target_dir)
        made = await self._engine(["exec", "-u", "root", self._container, "mkdir", "-p", target_dir], 60)
        if made.return_code != 0:
            raise RuntimeError(f"mkdir -p {target_dir} in the task container failed: {made.stderr or ''}")
        await self._copy_in(f"{source_dir}/.", target_dir)
