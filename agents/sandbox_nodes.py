"""Episode containers spread over a Ray cluster's nodes: a sandbox service per node, each owning that node's podman.

Owns: `SandboxService`, a Ray actor pinned to its node (no CPU of its own) that runs `LocalSandboxes` there — the
row's image built or named, its repository cut, the container started, scored, reset or removed — with the node's own
podman store (`ContainerSettings.node_store`, and `image_store` for images every node reads) and the node's own budgets
(`max_running`, `max_memory`, `image_disk_gb`, `warm_pool` per node); and `ClusterSandboxes`, the driver's side: one
service per live node (offering `node_resource` when it is set), each episode's container placed on the node with the
most free places (the fewest held, when no cap is set), and the relay (`sandbox_relay`) through which the harness's
`exec` commands reach the container on its node. A service that dies fails the calls it was serving with an
`InfraError` (the episodes run again, never scored); Ray starts it again on its node and the new one removes what the
dead one left (its containers carry its pid), at its first call or at `close`. Does not own: what a container does
(`containers`), the harness, or the Ray cluster (`fullasync.infra.runtime`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fullasync.errors import InfraError
from fullasync_agents.containers import ContainerSettings, run_cli
from fullasync_agents.sandbox_relay import VALUED, Relay
from fullasync_agents.sandboxes import LocalSandboxes, Sandbox
from fullasync_agents.swe_tasks.swebench import SweScore

log = logging.getLogger(__name__)
NODE = 12  # characters of a node's id in names and paths
RESTARTS = 3  # a killed service comes back on its node this often
# A call sent before Ray has seen the service die fails though Ray starts it again (on a loaded machine the first
# probe often is): the probe asks again this often, a second apart, before it counts the service gone
PROBE_TRIES, PROBE_BACKOFF_S = 10, 1.0
EXEC_LIMIT_S = 6 * 3600.0  # a relayed command's bound on the node: the harness's own timeout ends it sooner


def node_executable(settings: ContainerSettings, node: str) -> str:
    """The node's podman: `settings.executable`, or a script running it on the node's own store (`node_store`) and
    reading images from `image_store` too."""
    if not settings.node_store and not settings.image_store:
        return settings.executable
    store = Path(settings.node_store.replace("{node}", node[:NODE]) or f"/tmp/fa-sandbox-{node[:NODE]}")
    store.mkdir(parents=True, exist_ok=True)
    options = ["--root", str(store / "root"), "--runroot", str(store / "run")]
    if settings.image_store:
        options += ["--storage-driver", "overlay", "--storage-opt", f"overlay.imagestore={settings.image_store}"]
    script = store / "podman"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(settings.executable)} {shlex.join(options)} \"$@\"\n")
    script.chmod(0o700)
    return str(script)


def exec_target(argv: list[str]) -> str:
    """The container id of a relayed `exec [-i] [-w DIR] [-e K=V]... [-u USER] <id> <command...>` (else ValueError)."""
    if argv[:1] != ["exec"]:
        raise ValueError(f"the sandbox relay runs `exec` only, not {shlex.join(argv[:1])!r}")
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] not in (*VALUED, "-i", "--interactive"):
            raise ValueError(f"the sandbox relay does not pass exec's option {argv[i]!r} (-i, -w, -e, -u only)")
        i += 2 if argv[i] in VALUED else 1
    if i + 1 >= len(argv):
        raise ValueError(f"`{shlex.join(argv)}` names no container and command")
    return argv[i]


class SandboxService:
    """One node's containers (a Ray actor pinned to the node): `LocalSandboxes` on the node's podman."""

    def __init__(self, settings: ContainerSettings, node: str) -> None:
        self.node = node
        self.executable = node_executable(settings, node)
        self.sandboxes = LocalSandboxes(replace(settings, executable=self.executable, placement="local",
                                                   node_store="", image_store=""))
        self._swept: asyncio.Task[list[str]] | None = None

    async def _ready(self) -> None:
        """Once per instance, before anything: remove what a dead instance of this service left on the node."""
        if self._swept is None:
            self._swept = asyncio.ensure_future(self.sandboxes.containers.sweep())
        await asyncio.shield(self._swept)

    async def info(self) -> dict[str, Any]:
        await self._ready()
        return {"node": self.node, "pid": os.getpid(), "executable": self.executable}

    async def preflight(self) -> str:
        await self._ready()
        return await self.sandboxes.preflight()

    async def ahead(self, task: Mapping[str, Any], episodes: int) -> None:
        await self._ready()
        await self.sandboxes.ahead(task, episodes)

    async def start(self, task: Mapping[str, Any], episode_id: str) -> Sandbox:
        await self._ready()
        return replace(await self.sandboxes.start(task, episode_id), node=self.node)

    async def exec(self, argv: list[str], stdin: bytes | None) -> tuple[int, str]:
        """A relayed `exec` into a container this service started (and still holds)."""
        await self._ready()
        self.sandboxes.held(exec_target(argv))
        done = await run_cli([self.executable, *argv], EXEC_LIMIT_S, stdin)
        return done.returncode, done.output

    async def score(self, sandbox: Sandbox, timeout_s: float) -> SweScore:
        await self._ready()
        return await self.sandboxes.score(sandbox, timeout_s)

    async def finish(self, sandbox: Sandbox) -> None:
        await self._ready()
        await self.sandboxes.finish(sandbox)

    async def running(self) -> list[str]:
        """The ids of every fullasync container on this node's store (what a test counts)."""
        listed = await run_cli([self.executable, "ps", "-aq", "--no-trunc", "--filter", "label=fullasync.managed=1"],
                               60.0)
        return listed.output.split() if listed.returncode == 0 else []

    async def close(self) -> None:
        await self._ready()
        await self.sandboxes.close()
        await self.sandboxes.containers.remove_mine()  # a start abandoned midway (its episode cancelled) too
        await self.sandboxes.containers.sweep()


class ClusterSandboxes:
    """The driver's side: a sandbox service on each live Ray node, containers placed by free places."""

    def __init__(self, settings: ContainerSettings) -> None:
        self.settings = settings
        self.services: dict[str, Any] = {}  # node id -> its SandboxService actor
        self.started: Counter[str] = Counter()  # containers started on each node
        self._held: Counter[str] = Counter()  # containers held now on each node
        self._where: dict[str, str] = {}  # container id -> node
        self._down: dict[str, asyncio.Task[None]] = {}  # nodes whose service failed: probed until it answers again
        self._up: asyncio.Task[None] | None = None
        self._closed = False
        self.relay = Relay(self._forward)

    @property
    def warm(self) -> bool:
        return self.settings.warm_pool > 0

    async def _ready(self) -> None:
        if self._up is None:
            self._up = asyncio.ensure_future(self._start_services())
        await asyncio.shield(self._up)

    async def _start_services(self) -> None:
        if not ray.is_initialized():
            raise InfraError("container.placement=cluster starts a sandbox service on each Ray node: Ray is not "
                             "started (a run starts it; elsewhere call fullasync.infra.runtime.init_ray() first)")
        resource = self.settings.node_resource
        nodes = sorted(node["NodeID"] for node in ray.nodes()
                       if node["Alive"] and (not resource or node["Resources"].get(resource, 0) > 0))
        if not nodes:
            raise InfraError(f"container.placement=cluster: no live Ray node offers {resource!r} "
                             "(container.node_resource names the nodes that run sandboxes; \"\": every node)")
        service = ray.remote(SandboxService)
        for node in nodes:
            self.services[node] = service.options(
                num_cpus=0, max_restarts=RESTARTS, max_task_retries=0, max_concurrency=10_000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            ).remote(self.settings, node)
        await self._each("info")
        await self.relay.start()
        log.info("sandboxes on %d node(s): %s", len(nodes), ", ".join(node[:NODE] for node in nodes))

    def _pick(self, planned: Counter[str] | None = None) -> str:
        """The node with the most free places: the fewest held (and `planned`), the fewest started among equals. Every
        node has the same places (`max_running`, `max_memory` are per node), so the fewest held has the most free."""
        planned = planned or Counter()
        nodes = [node for node in self.services if node not in self._down] or list(self.services)
        return min(nodes, key=lambda node: (self._held[node] + planned[node], self.started[node], node))

    async def _call(self, node: str, method: str, *args: object) -> Any:
        """`method` of the node's service; its death (or Ray's failure to reach it) is an InfraError, and the node
        takes no containers until its service (started again by Ray on its node) answers."""
        reference = getattr(self.services[node], method).remote(*args)
        try:
            return await reference
        except asyncio.CancelledError:
            ray.cancel(reference)
            raise
        except ray.exceptions.RayActorError as error:
            if node not in self._down:
                self._down[node] = asyncio.ensure_future(self._probe(node))
            raise InfraError(f"the sandbox service of node {node[:NODE]} failed during {method} ({type(error).__name__}"
                             "): the episode runs again; the service, started again, removes its container") from error

    async def _each(self, method: str, failures: bool = False) -> dict[str, Any]:
        """`method` of every node's service at once, by node (`failures`: a failure in its place, not raised)."""
        nodes = list(self.services)
        answers = await asyncio.gather(*(self._call(node, method) for node in nodes), return_exceptions=failures)
        return dict(zip(nodes, answers, strict=True))

    async def _probe(self, node: str) -> None:
        """Wait for the node's service to answer again (its first call removes what the dead one left); a service
        that fails `PROBE_TRIES` probes is gone (Ray's restarts spent, or its node)."""
        for tried in range(1, PROBE_TRIES + 1):
            try:
                await self.services[node].info.remote()
            except ray.exceptions.RayActorError as error:
                if tried == PROBE_TRIES:
                    log.warning("the sandbox service of node %s is gone (%s): no more containers there", node[:NODE],
                                error)
                    return
                await asyncio.sleep(PROBE_BACKOFF_S)
                continue
            log.info("the sandbox service of node %s is back", node[:NODE])
            del self._down[node]
            return

    async def preflight(self) -> str:
        await self._ready()
        problems = await self._each("preflight")
        return "; ".join(f"node {node[:NODE]}: {problem}" for node, problem in problems.items() if problem)

    async def ahead(self, task: Mapping[str, Any], episodes: int) -> None:
        """The episodes' containers started ahead on the nodes `start` would place them on now."""
        await self._ready()
        planned: Counter[str] = Counter()
        for _ in range(episodes):
            planned[self._pick(planned)] += 1
        await asyncio.gather(*(self._call(node, "ahead", task, count) for node, count in planned.items()))

    async def start(self, task: Mapping[str, Any], episode_id: str) -> Sandbox:
        await self._ready()
        node = self._pick()
        self._held[node] += 1
        try:
            sandbox: Sandbox = await self._call(node, "start", task, episode_id)
        except BaseException:
            self._held[node] -= 1
            raise
        self.started[node] += 1
        self._where[sandbox.id] = node
        return replace(sandbox, executable=self.relay.client)

    async def score(self, sandbox: Sandbox, timeout_s: float) -> SweScore:
        score: SweScore = await self._call(sandbox.node, "score", sandbox, timeout_s)
        return score

    async def finish(self, sandbox: Sandbox) -> None:
        try:
            await self._call(sandbox.node, "finish", sandbox)
        finally:
            if self._where.pop(sandbox.id, None) is not None:
                self._held[sandbox.node] -= 1

    async def _forward(self, argv: list[str], stdin: bytes | None) -> tuple[int, str]:
        """A relayed `exec`, to the service of the node its container runs on."""
        node = self._where.get(exec_target(argv))
        if node is None:
            raise ValueError(f"no episode container {exec_target(argv)[:12]} of this run is running")
        answer: tuple[int, str] = await self._call(node, "exec", argv, stdin)
        return answer

    async def running(self) -> dict[str, list[str]]:
        """Every fullasync container on each node's store, by node."""
        await self._ready()
        found: dict[str, list[str]] = await self._each("running")
        return found

    async def close(self) -> None:
        """Each node's containers removed (what a dead service left too), the services ended, the relay closed."""
        if self._up is None or self._closed:
            return
        self._closed = True
        await asyncio.wait({self._up})  # started (or failed to)
        try:
            for node, result in (await self._each("close", failures=True)).items():
                if isinstance(result, BaseException):
                    log.warning("closing the sandboxes of node %s failed: %s", node[:NODE], result)
        finally:
            for probe in self._down.values():
                probe.cancel()
            for actor in self.services.values():
                ray.kill(actor)
            await self.relay.stop()
