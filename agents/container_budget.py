"""What episode containers may take of a host: running places, memory, the project's images on disk; and the
preflight that says in one line what is missing before the first step.

Owns: `places(settings)` — how many containers of one process may run at once (`max_running`, and `max_memory`
divided by each container's `memory`; 0 for no cap); `ImageBudget` — the images this project built (task images
from recipes, repositories cut at their base commit: label `fullasync.image`), what each adds to the disk (its
size less that of the image it was built from, label `fullasync.image.from`: podman reports every image's size
with its shared layers), when this process last used each, and `enforce`: while the sum over those this process
built or used is over `image_disk_gb`, remove the least recently used — never the one just built, one a container
runs, another run's image or one the project did not build (a base image, a row's named image); one removed and
needed again is built again; and
`preflight` — the container CLI, its store's free disk, the base image. Does not own: building or starting
containers (`fullasync_agents.containers`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from fullasync.infra.offload import loop_time
from fullasync_agents.sandbox import Finished

BUILT = "fullasync.image"  # label of an image this project built ("task" or "cut"): the run may remove it
BUILT_FROM = "fullasync.image.from"  # label: the id of the image it was built from
MIN_FREE_GB = 2.0  # free disk under the container store below which nothing is started
Cli = Callable[[Sequence[str], float], Awaitable[Finished]]
log = logging.getLogger(__name__)
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def memory_bytes(text: str) -> int:
    """`2g`, `512m`, `1024` (bytes) as podman reads `--memory`."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)b?\s*", text.lower())
    if found is None:
        raise ValueError(f"containers: memory {text!r} is not a size; write it as podman does (512m, 2g)")
    return int(float(found[1]) * _UNITS[found[2]])


def places(max_running: int, max_memory: str, memory: str) -> int:
    """Containers one process may run at once: 0 for no cap."""
    caps = [max_running] if max_running > 0 else []
    if max_memory:
        caps.append(max(1, memory_bytes(max_memory) // memory_bytes(memory)))
    return min(caps, default=0)


@dataclass(frozen=True)
class Held:
    """One of the project's images as the budget sees it."""

    id: str
    tags: tuple[str, ...]
    own_bytes: int  # its size less its source's


@dataclass
class ImageBudget:
    """The project's images on this host, held to `budget_gb` (0: no budget) by removing the least recently used."""

    executable: str
    budget_gb: float
    cli: Cli
    removed: list[str] = field(default_factory=list)  # the tags removed so far
    _used: dict[str, float] = field(default_factory=dict)  # image (id or name) -> when this process last used it
    _running: dict[str, int] = field(default_factory=dict)  # image -> this process's containers of it

    def used(self, image: str) -> None:
        self._used[image] = loop_time()

    def started(self, image: str) -> None:
        self.used(image)
        self._running[image] = self._running.get(image, 0) + 1

    def stopped(self, image: str) -> None:
        self._running[image] = self._running.get(image, 1) - 1

    async def held(self) -> list[Held]:
        """The project's tagged images this process built or used, each with what it adds to the disk (the untagged
        steps it was built in are in its size, and go with it); other runs' images are theirs."""
        listed = await self.cli([self.executable, "images", "-q", "--no-trunc", "--filter", f"label={BUILT}"], 60.0)
        ids = sorted({_id(line) for line in listed.output.split()}) if listed.returncode == 0 else []
        if not ids:
            return []
        inspected = await self.cli([self.executable, "image", "inspect", *ids], 60.0)
        images = json.loads(inspected.output or "[]") if inspected.returncode == 0 else []
        sizes = await self._sizes({_labels(image).get(BUILT_FROM, "") for image in images} - {""})
        held = [Held(_id(str(image["Id"])), tuple(image["RepoTags"]),
                     max(0, int(image.get("Size", 0)) - sizes.get(_id(_labels(image).get(BUILT_FROM, "")), 0)))
                for image in images if image.get("RepoTags")]
        return [image for image in held if any(name in self._used for name in (image.id, *image.tags))]

    async def enforce(self, keep: str = "") -> list[str]:
        """Remove the least recently used of this process's images until they fit; the tags removed. `keep` (the
        image just built) and the images this process's containers run stay; so does one another process runs."""
        if self.budget_gb <= 0:
            return []
        held = await self.held()
        total, budget = sum(image.own_bytes for image in held), self.budget_gb * 1e9
        removed: list[str] = []
        for image in sorted(held, key=self._last_used):
            names = {image.id, *image.tags}
            if total <= budget:
                break
            if keep in names or any(self._running.get(name, 0) > 0 for name in names):
                continue
            if (await self.cli([self.executable, "rmi", *image.tags], 120.0)).returncode == 0:
                total -= image.own_bytes
                removed.extend(image.tags)
        if total > budget:
            log.warning("the project's images take %.2f GB, over container.image_disk_gb=%.2f, and the rest are in "
                        "use or just built: raise the budget or free disk", total / 1e9, self.budget_gb)
        self.removed.extend(removed)
        return removed

    def _last_used(self, image: Held) -> float:
        return max(self._used.get(name, -1.0) for name in (image.id, *image.tags))

    async def _sizes(self, ids: set[str]) -> dict[str, int]:
        sizes = {}
        for image_id in sorted(ids):  # one at a time: a source removed since must not hide the others
            done = await self.cli([self.executable, "image", "inspect", "--format", "{{.Size}}", image_id], 60.0)
            if done.returncode == 0 and done.output.strip().isdigit():
                sizes[_id(image_id)] = int(done.output.strip())
        return sizes


async def preflight(executable: str, cli: Cli, hint: str, base_image: str = "") -> str:
    """What stops containers from starting here (the CLI, its store's free disk, `base_image` when given), in one
    line naming the fix; "" when nothing does."""
    if shutil.which(executable) is None:
        return f"containers: {executable} is not installed: {hint}"
    root_field = "{{.DockerRootDir}}" if os.path.basename(executable) == "docker" else "{{.Store.GraphRoot}}"
    info = await cli([executable, "info", "--format", root_field], 60.0)
    if info.returncode != 0 or not info.output.strip():
        return f"containers: `{executable} info` failed ({info.output.strip()[-200:]}): {hint}"
    root = info.output.strip().splitlines()[-1]
    free = shutil.disk_usage(root).free / 1e9 if os.path.isdir(root) else MIN_FREE_GB  # a remote daemon's: unseen
    if free < MIN_FREE_GB:
        return (f"containers: {free:.1f} GB free under {root}, {MIN_FREE_GB:.0f} GB needed: free disk there, or "
                "cap the project's images with container.image_disk_gb")
    if base_image and (await cli([executable, "image", "exists", base_image], 60.0)).returncode != 0:
        return f"containers: the base image {base_image} is missing: {hint}"
    return ""


def _id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")


def _labels(image: dict[str, object]) -> dict[str, str]:
    config = image.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
