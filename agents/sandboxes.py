"""Where an episode's container runs: on this host (`LocalSandboxes`) or on a Ray node with room (`sandbox_nodes`).

Owns: the one interface a harness generator drives its episodes' containers through — `preflight`, `ahead` (a row's
containers started before its episodes), `start` (the row's image built or named, its repository cut at the base
commit, a container started: a `Sandbox`), `score` (the row's tests in it), `finish` (removed, or reset for the next
episode), `close` — and the choice between the two by `ContainerSettings.placement` (`sandboxes_for`). A `Sandbox`
names what the harness needs to reach its container: its id, the executable it runs `<executable> exec ...` with (this
host's podman, or the relay into the service of the container's node) and the task as the cut left it. Does not own:
starting containers (`containers`), the cut (`swe_tasks.history`) or the tests (`swe_tasks.swebench`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fullasync.errors import InfraError
from fullasync_agents.containers import Container, Containers, ContainerSettings
from fullasync_agents.swe_tasks.history import HistoryGuard
from fullasync_agents.swe_tasks.swebench import SweScore, score_in_container


@dataclass(frozen=True)
class Sandbox:
    """An episode's running container, as its harness reaches it."""

    id: str
    executable: str  # `<executable> exec -w <dir> <id> bash -lc <command>` runs a command in it
    task: Mapping[str, Any]  # the row as a container task (its `workdir` named, its image cut at the base)
    node: str = ""  # the Ray node whose sandbox service runs it; "": this process

    @property
    def workdir(self) -> str:
        return str(self.task["workdir"])


class Sandboxes(Protocol):
    """What a generator calls for its episodes' containers (`LocalSandboxes`, `sandbox_nodes.ClusterSandboxes`)."""

    @property
    def warm(self) -> bool: ...  # a warm pool: `ahead` starts containers

    async def preflight(self) -> str: ...

    async def ahead(self, task: Mapping[str, Any], episodes: int) -> None: ...

    async def start(self, task: Mapping[str, Any], episode_id: str) -> Sandbox: ...

    async def score(self, sandbox: Sandbox, timeout_s: float) -> SweScore: ...

    async def finish(self, sandbox: Sandbox) -> None: ...

    async def close(self) -> None: ...


class LocalSandboxes:
    """The containers of this process's podman (or docker), their repositories cut at the base commit."""

    def __init__(self, settings: ContainerSettings) -> None:
        self.containers = Containers(settings)
        self.history = HistoryGuard(self.containers)
        self._held: dict[str, Container] = {}  # started and not finished, by id

    @property
    def warm(self) -> bool:
        return self.containers.pool is not None

    async def preflight(self) -> str:
        return await self.containers.preflight()

    async def ahead(self, task: Mapping[str, Any], episodes: int) -> None:
        await self.history.ahead(task, await self.containers.image_for(task), episodes)

    async def start(self, task: Mapping[str, Any], episode_id: str) -> Sandbox:
        container, cut = await self.history.start(task, await self.containers.image_for(task), episode_id)
        self._held[container.id] = container
        return Sandbox(container.id, container.executable, cut)

    def held(self, container_id: str) -> Container:
        """The started container `container_id` (InfraError if this process holds no such container)."""
        container = self._held.get(container_id)
        if container is None:
            raise InfraError(f"no container {container_id[:12]} is held here: it was never started or has ended")
        return container

    async def score(self, sandbox: Sandbox, timeout_s: float) -> SweScore:
        return await score_in_container(sandbox.task, self.held(sandbox.id), timeout_s)

    async def finish(self, sandbox: Sandbox) -> None:
        container = self._held.pop(sandbox.id, None)
        if container is None:  # held by an earlier instance (a restarted service): removed all the same
            container = Container(sandbox.id, self.containers.settings.executable, sandbox.workdir)
            await container.remove()
            return
        await self.containers.finish(container)

    async def close(self) -> None:
        """Remove what is still held, then the warm pool."""
        held, self._held = list(self._held.values()), {}
        for container in held:
            await container.remove()
        await self.containers.close()


def sandboxes_for(settings: ContainerSettings) -> Sandboxes:
    """This host's containers, or (placement=cluster) a sandbox service on each Ray node."""
    if settings.placement == "cluster":
        from fullasync_agents.sandbox_nodes import ClusterSandboxes  # imports Ray

        return ClusterSandboxes(settings)
    return LocalSandboxes(settings)
