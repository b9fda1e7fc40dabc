"""Task containers: one per episode, from the row's image, with limits, labels and no network.

Owns: starting a container (`Containers.start`: at most `max_starting` at once per process, a start that fails or
outlasts `start_timeout_s` is an `InfraError` — the episode runs again, the row is not charged), running commands
and writing files in it (`Container.exec`, `Container.write_files`), removing it when its episode ends, and
removing the containers a dead process left (`Containers.sweep`: every container carries its starter's host and
pid as labels; one whose starter is gone is removed at the next start — after a SIGKILL of the run). Images named
by a recipe are built here, once, from the local base image (`image_for`). Podman by default (`containers/setup.sh`
installs and configures it); a docker CLI works the same (`executable`). Does not own: what runs in the container
(the harness) or what a result means (the scoring, `fullasync_agents.container_scoring`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shlex
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fullasync.errors import InfraError
from fullasync_agents.container_budget import BUILT, BUILT_FROM, ImageBudget, memory_bytes, places, preflight
from fullasync_agents.container_pool import Check, WarmPool, checked
from fullasync_agents.sandbox import Finished, run_bounded

MANAGED = "fullasync.managed"  # every container we start carries this label ...
OWNER = "fullasync.owner"  # ... and "<host>/<pid>" of the process that started it
EPISODE = "fullasync.episode"  # ... and its episode's id
BASE_IMAGE = "localhost/fullasync/python:3.11"  # containers/setup.sh builds it from Debian's mirror
SETUP_HINT = "run `make setup-containers` (containers/setup.sh: podman, its configuration, the base images)"
# A recipe's repository is committed with these: the same files give the same commit on every machine.
_GIT_IDENTITY = {"GIT_AUTHOR_NAME": "fullasync", "GIT_AUTHOR_EMAIL": "tasks@fullasync.invalid",
                 "GIT_COMMITTER_NAME": "fullasync", "GIT_COMMITTER_EMAIL": "tasks@fullasync.invalid",
                 "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


@dataclass(frozen=True)
class ContainerSettings:
    """How episode containers start (a Hydra-friendly frozen dataclass)."""

    executable: str = "podman"  # or "docker"
    memory: str = "2g"  # --memory
    pids: int = 512  # --pids-limit
    cpus: float = 1.0  # --cpus
    network: str = "none"  # "host" for an agent inside the container that must reach the gateway on loopback
    max_starting: int = 4  # containers starting at once (per process): a daemon or disk overloaded by a burst
    start_timeout_s: float = 120.0  # a start slower than this is an infrastructure failure
    build_timeout_s: float = 600.0  # building a recipe's image (or an image's cut at its base commit)
    # a SWE row's repository: "base" holds nothing after the row's base commit (`swe_tasks.history`: no later commit,
    # branch, tag, reflog or dangling object an agent could read the fix from); "full" as the image has it
    git_history: str = "base"
    max_running: int = 0  # containers of this process running at once (a start waits for a place); 0: no cap
    max_memory: str = ""  # their `memory` limits together at most this (e.g. 64g: 32 places of 2g); "": no cap
    # the images this project built (task images, cut repositories) on this host's disk: past it the least
    # recently used are removed (built again when needed); 0: no budget
    image_disk_gb: float = 0.0
    # containers started ahead of the episodes that take them (for the rows about to start, then refilled behind
    # the image taken last), in all: about the run's episodes in flight; 0: each episode starts its own
    warm_pool: int = 0
    # an episode's container serves the next episode of its image after a verified reset (`container_reset`:
    # repository, /tmp, $HOME, processes, a canary); a dirty reset removes it. Needs warm_pool > 0
    reuse: bool = False
    # where episode containers run: "local", this process's podman; "cluster", a sandbox service on each Ray node
    # (`sandbox_nodes`) owning that node's podman, each container on the node with the most free places (the caps
    # above are per node) and the harness's commands relayed to it
    placement: str = "local"
    node_resource: str = ""  # placement=cluster: only nodes offering this Ray resource run sandboxes; "": every node
    # placement=cluster: each node's podman store, `{node}` its node id (12 characters); "": the node's own default.
    # Two nodes on one host need their own (podman's --root and --runroot under it)
    node_store: str = ""
    image_store: str = ""  # placement=cluster: a read-only podman image store each node's podman reads images from too

    def __post_init__(self) -> None:
        if self.max_starting < 1 or self.pids < 1 or self.cpus <= 0:
            raise ValueError("containers: max_starting and pids must be >= 1 and cpus > 0")
        if self.network not in ("none", "host"):
            raise ValueError(f"containers: network={self.network!r}; choose none (task containers) or host (an "
                             "agent inside that calls the gateway on 127.0.0.1); bridges are never used")
        if self.max_running < 0 or self.image_disk_gb < 0 or self.warm_pool < 0:
            raise ValueError(f"containers: max_running={self.max_running}, image_disk_gb={self.image_disk_gb} and "
                             f"warm_pool={self.warm_pool} must be >= 0 (0: off)")
        if self.reuse and not self.warm_pool:
            raise ValueError("containers: reuse=true puts reset containers back into the warm pool: set warm_pool "
                             "too (e.g. container.warm_pool=16)")
        memory_bytes(self.memory)  # a size podman reads, or a ValueError saying how to write one
        if self.max_memory:
            memory_bytes(self.max_memory)
        if self.placement not in ("local", "cluster"):
            raise ValueError(f"containers: placement={self.placement!r}; choose local (this process's podman) or "
                             "cluster (a sandbox service on each Ray node)")
        if (self.node_store or self.image_store) and (self.placement != "cluster"
                                                      or os.path.basename(self.executable) != "podman"):
            raise ValueError("containers: node_store and image_store are the stores of each node's podman: set "
                             "placement=cluster and executable=podman with them")
        if self.git_history not in ("base", "full"):
            raise ValueError(f"containers: git_history={self.git_history!r}; choose base (the repository ends at the "
                             "row's base commit: nothing to read the fix from) or full (as the image has it)")


async def run_cli(argv: Sequence[str], timeout_s: float, stdin: bytes | None = None) -> Finished:
    """Run `argv` (podman or docker) on the host; at `timeout_s` it is killed (`timed_out`)."""
    try:
        return await run_bounded(argv, timeout_s, stdin=stdin)
    except OSError as error:
        raise InfraError(f"{argv[0]} could not start ({error}): {SETUP_HINT}") from error


def owner() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def _alive(owner: str) -> bool:
    host, _, pid = owner.rpartition("/")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's: not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _started_at(pid: int) -> str:
    """When process `pid` of this host started (clock ticks since boot, /proc/<pid>/stat), or "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


@dataclass
class Container:
    """A running episode container; `exec` runs a shell command in it as bash -lc does."""

    id: str
    executable: str
    workdir: str
    image: str = ""
    released: Callable[[], None] | None = field(default=None, repr=False)  # its running place, given back once
    _init: tuple[int, str] | None = field(default=None, repr=False)  # its init's pid here and when it started

    async def cli(self, *args: str, timeout_s: float = 60.0) -> Finished:
        """`<executable> <args> <id>` on the host (inspect, diff, ...)."""
        return await run_cli([self.executable, *args, self.id], timeout_s)

    async def alive(self) -> bool:
        """Running. The first answer comes from `inspect`, and records its init's pid on this host: later ones read
        /proc (microseconds, not the ~40 ms of an inspect: a warm pool's take asks), the pid's start time guarding
        against a reused pid."""
        if self._init is not None:
            return _started_at(self._init[0]) == self._init[1]
        done = await self.cli("inspect", "--format", "{{.State.Running}} {{.State.Pid}}")
        running, _, pid = done.output.strip().rpartition("\n")[2].partition(" ")
        if done.returncode != 0 or running != "true":
            return False
        if pid.isdigit() and (started := _started_at(int(pid))):
            self._init = (int(pid), started)
        return True

    async def exec(self, command: str, timeout_s: float, workdir: str | None = None,
                   stdin: bytes | None = None) -> Finished:
        """`command` in the container's shell; at `timeout_s` the exec is abandoned (what it started keeps running
        until the container is removed)."""
        argv = [self.executable, "exec", *(["-i"] if stdin is not None else []), "-w", workdir or self.workdir,
                self.id, "bash", "-lc", command]
        return await run_cli(argv, timeout_s, stdin)

    async def write_files(self, files: Mapping[str, str], timeout_s: float = 60.0) -> None:
        """Write `files` (path relative to the workdir → text) into the container, directories made as needed."""
        for name, content in files.items():
            target = shlex.quote(name)
            done = await self.exec(f"mkdir -p \"$(dirname {target})\" && cat > {target}", timeout_s,
                                   stdin=content.encode())
            if done.returncode != 0:
                raise InfraError(f"container {self.id[:12]}: writing {name} failed: {done.output.strip()[-500:]}")

    async def remove(self) -> None:
        try:
            await run_cli([self.executable, "rm", "-f", "-t", "0", self.id], 60.0)
        finally:
            released, self.released = self.released, None
            if released is not None:
                released()


@dataclass
class Containers:
    """The episode containers of this process: starts capped, orphans of dead processes swept once."""

    settings: ContainerSettings = field(default_factory=ContainerSettings)
    started: int = 0  # containers started so far
    _starting: asyncio.Semaphore | None = None
    _swept: bool = False
    _builds: dict[str, asyncio.Lock] = field(default_factory=dict)
    _running: asyncio.Semaphore | None = None  # places to run (`max_running`, `max_memory`), made on first start

    def __post_init__(self) -> None:
        settings = self.settings
        self.budget = ImageBudget(settings.executable, settings.image_disk_gb, run_cli)  # the images' disk
        self.places = places(settings.max_running, settings.max_memory, settings.memory)  # 0: no cap
        self.pool = WarmPool(settings.warm_pool, self._start_new, settings.reuse) if settings.warm_pool else None

    async def preflight(self, base_image: str = "") -> str:
        """What would stop this process's containers, in one line naming the fix ("" when nothing)."""
        return await preflight(self.settings.executable, run_cli, SETUP_HINT, base_image)

    async def start(self, image: str, workdir: str, episode_id: str, check: Check | None = None) -> Container:
        """A container of `image` running `sleep infinity` under an init, in `workdir`, that passed `check` — from
        the warm pool when one is ready; InfraError if it cannot start in time (or the image is missing: say how to
        get it). Give it back with `finish`."""
        if self.pool is not None:
            return await self.pool.take((image, workdir), episode_id, check)
        container = await self._start_new(image, workdir, episode_id, True)
        assert container is not None  # a start that waits for its place always gets one
        return await checked(container, check)

    def ahead(self, image: str, workdir: str, count: int, check: Check | None = None) -> None:
        """`count` episodes of `image` are about to start: with a warm pool, their containers start now."""
        if self.pool is not None:
            self.pool.ahead((image, workdir), count, check)

    async def finish(self, container: Container) -> None:
        """After its episode: back to the pool after a verified reset (`reuse`), else removed."""
        if self.pool is None or not self.pool.give_back(container):
            await container.remove()

    async def close(self) -> None:
        """Remove the warm pool's containers (after those starting or resetting have)."""
        if self.pool is not None:
            await self.pool.close()

    async def _start_new(self, image: str, workdir: str, episode_id: str, wait: bool) -> Container | None:
        """A fresh container; with `wait` False, None when no running place is free now."""
        settings = self.settings
        if not self._swept:
            self._swept = True
            await self.sweep()
        if self._starting is None:
            self._starting = asyncio.Semaphore(settings.max_starting)
        argv = [settings.executable, "run", "-d", "--init", f"--network={settings.network}",
                f"--memory={settings.memory}", f"--pids-limit={settings.pids}", f"--cpus={settings.cpus}",
                "--label", f"{MANAGED}=1", "--label", f"{OWNER}={owner()}", "--label", f"{EPISODE}={episode_id}",
                "-w", workdir, image, "sleep", "infinity"]
        released = await self._place(image, wait)
        if released is None:
            return None
        try:
            async with self._starting:
                done = await run_cli(argv, settings.start_timeout_s)
            if done.timed_out or done.returncode != 0:
                await self.remove_episode(episode_id)  # a start abandoned at its timeout may still come up
                why = (f"did not start within {settings.start_timeout_s:.0f} s" if done.timed_out
                       else f"failed to start: {done.output.strip()[-800:]}")
                raise InfraError(f"container of {image} for episode {episode_id} {why} (is the image built? "
                                 f"{SETUP_HINT})")
        except BaseException:
            released()
            raise
        self.started += 1
        return Container(done.output.strip().splitlines()[-1], settings.executable, workdir, image, released)

    async def _place(self, image: str, wait: bool) -> Callable[[], None] | None:
        """A running place (when capped): waited for (a ready warm container gives its own up), or None when none is
        free now and `wait` is False; what gives it back. The image is in use until then."""
        if self.places and self._running is None:
            self._running = asyncio.Semaphore(self.places)
        running = self._running
        if running is not None:
            if running.locked() and not wait:
                return None
            if running.locked() and self.pool is not None:
                await self.pool.free_one()
            await running.acquire()
        self.budget.started(image)

        def release() -> None:
            self.budget.stopped(image)
            if running is not None:
                running.release()
                if self.pool is not None:
                    self.pool.fill()  # a place is free: a warm container may start in it
        return release

    async def remove_episode(self, episode_id: str) -> list[str]:
        """Remove every container labelled with `episode_id` (what a killed harness left); the ids removed."""
        return await self._remove_labelled(EPISODE, episode_id)

    async def remove_mine(self) -> list[str]:
        """Remove every container this process started (a start abandoned midway included); the ids removed."""
        return await self._remove_labelled(OWNER, owner())

    async def _remove_labelled(self, label: str, value: str) -> list[str]:
        found = await run_cli([self.settings.executable, "ps", "-aq", "--filter", f"label={label}={value}"], 60.0)
        ids = found.output.split() if found.returncode == 0 else []
        if ids:
            await run_cli([self.settings.executable, "rm", "-f", "-t", "0", *ids], 60.0)
        return ids

    async def sweep(self) -> list[str]:
        """Remove every container of ours whose starting process is gone (this host); the ids removed."""
        listed = await run_cli([self.settings.executable, "ps", "-a", "--filter", f"label={MANAGED}=1", "--format",
                                f'{{{{.ID}}}} {{{{index .Labels "{OWNER}"}}}}'], 60.0)
        if listed.returncode != 0:
            raise InfraError(f"{self.settings.executable} ps failed: {listed.output.strip()[-500:]} ({SETUP_HINT})")
        orphans = [id_ for id_, _, owner in (line.partition(" ") for line in listed.output.splitlines())
                   if id_ and not _alive(owner.strip())]
        if orphans:
            await run_cli([self.settings.executable, "rm", "-f", "-t", "0", *orphans], 120.0)
        return orphans

    async def image_for(self, row: Mapping[str, Any]) -> str:
        """The row's image: `image` as named, or `image_recipe` built once (tagged by its content)."""
        if row.get("image"):
            self.budget.used(str(row["image"]))
            return str(row["image"])
        recipe = row.get("image_recipe")
        if not isinstance(recipe, Mapping):
            raise ValueError(f"row {row.get('id')!r} names no container image: give it `image` (a name your "
                             "podman or docker has) or `image_recipe` ({'files': {...}} built on "
                             f"{BASE_IMAGE})")
        key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
        tag = f"localhost/fullasync/task:{key}"
        lock = self._builds.setdefault(tag, asyncio.Lock())
        async with lock:
            exists = await run_cli([self.settings.executable, "image", "exists", tag], 60.0)
            if exists.returncode != 0:
                await self._build(tag, recipe)
            self.budget.used(tag)
        if exists.returncode != 0:
            await self.budget.enforce(keep=tag)
        return tag

    async def image_id(self, image: str) -> str:
        """The id of `image`, which must be here (InfraError naming how to get it)."""
        done = await run_cli([self.settings.executable, "image", "inspect", "--format", "{{.Id}}", image], 60.0)
        if done.returncode != 0 or not done.output.strip():
            raise InfraError(f"image {image} is not here: {done.output.strip()[-300:]} (build or load it first; "
                             f"{SETUP_HINT})")
        return done.output.strip().splitlines()[-1]

    async def _build(self, tag: str, recipe: Mapping[str, Any]) -> None:
        """`recipe['files']` committed as a git repository at `recipe['workdir']` (default /testbed) on
        `recipe['base']` (default the local Python image), or `recipe['context']` (relative path -> base64 of its
        bytes; a `Dockerfile` among them: a harbor task's environment/) built as it is; without a network."""
        built = self._build_context(tag, recipe["context"]) if "context" in recipe else self._build_files(tag, recipe)
        done = await built
        if done.returncode != 0:
            raise InfraError(f"building task image {tag} failed: {done.output.strip()[-800:]} ({SETUP_HINT})")

    async def _build_files(self, tag: str, recipe: Mapping[str, Any]) -> Finished:
        workdir = str(recipe.get("workdir", "/testbed"))
        with tempfile.TemporaryDirectory(prefix="fullasync-image-") as context:
            repo = Path(context) / "repo"
            for name, content in dict(recipe.get("files", {})).items():
                path = repo / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            repo.mkdir(exist_ok=True)
            env = " ".join(f"{key}={shlex.quote(value)}" for key, value in _GIT_IDENTITY.items())
            base = await self.image_id(str(recipe.get("base", BASE_IMAGE)))
            (Path(context) / "Containerfile").write_text(
                f"FROM {base}\nCOPY repo/ {workdir}/\n"
                f"RUN cd {workdir} && git init -q && git add -A && {env} git commit -qm base\n"
                f"WORKDIR {workdir}\nLABEL {BUILT}=task {BUILT_FROM}={base}\n")
            return await run_cli([self.settings.executable, "build", "--network=none", "--tag", tag, context],
                                 self.settings.build_timeout_s)

    async def _build_context(self, tag: str, files: Mapping[str, str]) -> Finished:
        with tempfile.TemporaryDirectory(prefix="fullasync-image-") as context:
            for name, content in files.items():
                path = Path(context, name)
                if not path.resolve().is_relative_to(Path(context).resolve()):
                    raise ValueError(f"image_recipe.context names {name!r}, outside its build context")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(content))
            return await run_cli([self.settings.executable, "build", "--network=none", "--label", f"{BUILT}=task",
                                  "--tag", tag, context], self.settings.build_timeout_s)
