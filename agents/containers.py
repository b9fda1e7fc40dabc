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
import hashlib
import json
import os
import shlex
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fullasync.errors import InfraError
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

    def __post_init__(self) -> None:
        if self.max_starting < 1 or self.pids < 1 or self.cpus <= 0:
            raise ValueError("containers: max_starting and pids must be >= 1 and cpus > 0")
        if self.network not in ("none", "host"):
            raise ValueError(f"containers: network={self.network!r}; choose none (task containers) or host (an "
                             "agent inside that calls the gateway on 127.0.0.1); bridges are never used")
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


@dataclass
class Container:
    """A running episode container; `exec` runs a shell command in it as bash -lc does."""

    id: str
    executable: str
    workdir: str

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
        await run_cli([self.executable, "rm", "-f", "-t", "0", self.id], 60.0)


@dataclass
class Containers:
    """The episode containers of this process: starts capped, orphans of dead processes swept once."""

    settings: ContainerSettings = field(default_factory=ContainerSettings)
    started: int = 0  # containers started so far
    _starting: asyncio.Semaphore | None = None
    _swept: bool = False
    _builds: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def start(self, image: str, workdir: str, episode_id: str) -> Container:
        """A container of `image` running `sleep infinity` under an init, in `workdir`; InfraError if it cannot
        start in time (or the image is missing: say how to get it)."""
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
        async with self._starting:
            done = await run_cli(argv, settings.start_timeout_s)
        if done.timed_out or done.returncode != 0:
            await self.remove_episode(episode_id)  # a start abandoned at its timeout may still come up
            why = (f"did not start within {settings.start_timeout_s:.0f} s" if done.timed_out
                   else f"failed to start: {done.output.strip()[-800:]}")
            raise InfraError(f"container of {image} for episode {episode_id} {why} (is the image built? "
                             f"{SETUP_HINT})")
        self.started += 1
        return Container(done.output.strip().splitlines()[-1], settings.executable, workdir)

    async def remove_episode(self, episode_id: str) -> list[str]:
        """Remove every container labelled with `episode_id` (what a killed harness left); the ids removed."""
        found = await run_cli([self.settings.executable, "ps", "-aq", "--filter", f"label={EPISODE}={episode_id}"],
                              60.0)
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
        return tag

    async def _build(self, tag: str, recipe: Mapping[str, Any]) -> None:
        """`recipe['files']` committed as a git repository at `recipe['workdir']` (default /testbed) on
        `recipe['base']` (default the local Python image); built without a network."""
        workdir = str(recipe.get("workdir", "/testbed"))
        with tempfile.TemporaryDirectory(prefix="fullasync-image-") as context:
            repo = Path(context) / "repo"
            for name, content in dict(recipe.get("files", {})).items():
                path = repo / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            repo.mkdir(exist_ok=True)
            env = " ".join(f"{key}={shlex.quote(value)}" for key, value in _GIT_IDENTITY.items())
            (Path(context) / "Containerfile").write_text(
                f"FROM {recipe.get('base', BASE_IMAGE)}\nCOPY repo/ {workdir}/\n"
                f"RUN cd {workdir} && git init -q && git add -A && {env} git commit -qm base\n"
                f"WORKDIR {workdir}\n")
            done = await run_cli([self.settings.executable, "build", "--network=none", "--tag", tag, context],
                                 self.settings.build_timeout_s)
        if done.returncode != 0:
            raise InfraError(f"building task image {tag} failed: {done.output.strip()[-800:]} ({SETUP_HINT})")
