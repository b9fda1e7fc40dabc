"""Task repositories that hold nothing after their base commit: no way to read the fix from git history.

Owns: `HistoryGuard` — for each (image, working directory, base commit) an image of its own, built once and kept by
podman, in which the repository's git directory is replaced by one fetched from the base commit alone (one branch,
no tags, remotes, stash, notes, reflog, alternates, worktrees, rerere cache or unreachable objects: a later commit
on another branch, a dangling blob of the fixed file, a packed ref all go), checked in full when it is built (every
object in the store reachable from the base, `git fsck` finding nothing unreachable) and recorded in the image's
labels; and, at each episode's container start, a cheap check of that record (HEAD, the one ref, no alternates, the
object count). A check that fails is an infrastructure failure: the container is removed, never scored.
The working tree is left as the image has it when its HEAD is the base (untracked files stay; the index is rebuilt
from the base commit); an image whose HEAD lies past the base gets the base's working tree (the later commits' files
removed).
`ContainerSettings.git_history = "full"` turns the guard off. Does not own: starting containers
(`fullasync_agents.containers`) or scoring (`swebench.py`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullasync.errors import InfraError
from fullasync_agents.container_budget import BUILT, BUILT_FROM
from fullasync_agents.container_pool import Check
from fullasync_agents.containers import Container, Containers, run_cli

VERSION = "2"  # of the cut below: a new version builds new images
LABEL = "fullasync.history"  # the record's labels: <LABEL>.base, .ref, .objects
_RECORD = re.compile(r"^FULLASYNC-HISTORY base=(\S*) ref=(\S*) objects=(\d+)$", re.M)

# Run inside the image at build time as root: $1 the working directory, $2 the base commit (empty: HEAD).
CUT = r"""set -euo pipefail
cd "$1"
if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "FULLASYNC-HISTORY base= ref= objects=0"; exit 0
fi
gitdir=$(git rev-parse --absolute-git-dir)
if [ "$gitdir" != "$PWD/.git" ]; then
    echo "the repository's git directory is $gitdir, not $PWD/.git (a linked worktree or a submodule)" >&2; exit 3
fi
base=$(git rev-parse --verify --quiet "${2:-HEAD}^{commit}") || {
    echo "the base commit ${2:-HEAD} is not in the repository at $PWD" >&2; exit 4; }
ref=$(git symbolic-ref -q HEAD || echo refs/heads/main)
head=$(git rev-parse HEAD)
added=$(mktemp)
git diff --name-only -z --diff-filter=A "$base" "$head" > "$added"  # files a later HEAD added: part of the fix
git update-ref refs/fullasync/cut "$base"
new=$(mktemp -d)
git init -q "$new"
git -C "$new" fetch -q --no-tags "$PWD" refs/fullasync/cut:refs/fullasync/cut
git -C "$new" update-ref "$ref" "$base"
git -C "$new" update-ref -d refs/fullasync/cut
git -C "$new" symbolic-ref HEAD "$ref"
rm -rf .git
mv "$new/.git" .git
rmdir "$new"
if [ "$head" = "$base" ]; then
    git reset -q  # the index from the base; the image's own edits to the working tree stay
else
    git reset -q --hard  # the working tree of a later commit holds the fix: back to the base's
    xargs -0 -r rm -f -- < "$added"
fi
rm -f "$added"
rm -rf .git/logs .git/hooks .git/FETCH_HEAD .git/ORIG_HEAD
reachable=$(git rev-list --objects --all | wc -l)
stored=$(git count-objects -v | awk '/^(count|in-pack):/ {n += $2} END {print n}')
unreachable=$(git fsck --unreachable --no-reflogs --no-progress 2>&1 | grep -c -E 'unreachable|dangling' || true)
if [ "$reachable" != "$stored" ] || [ "$unreachable" != 0 ]; then
    echo "the cut repository holds $stored objects, $reachable reachable from the base, $unreachable unreachable" >&2
    exit 5
fi
echo "FULLASYNC-HISTORY base=$base ref=$ref objects=$stored"
"""

# Run in each episode's container before the agent: the repository still is what the record says.
CHECK = r"""cd "$1" 2>/dev/null && head=$(git rev-parse HEAD 2>&1) || { echo "no repository at $1: $head"; exit 1; }
refs=$(git for-each-ref --format='%(objectname) %(refname)')
stored=$(git count-objects -v | awk '/^(count|in-pack):/ {n += $2} END {print n}')
[ "$head" = "$2" ] || { echo "HEAD is $head, not the base $2"; exit 1; }
[ "$refs" = "$2 $3" ] || { echo "refs: $refs"; exit 1; }
[ ! -e .git/objects/info/alternates ] || { echo "the store borrows objects (objects/info/alternates)"; exit 1; }
[ "$stored" = "$4" ] || { echo "$stored objects in the store, $4 when it was cut"; exit 1; }
"""


@dataclass(frozen=True)
class Cut:
    """An image whose repository ends at `base` (empty: the image has no repository at the working directory)."""

    image: str
    base: str
    ref: str
    objects: int

    def checker(self, workdir: str) -> Check:
        """`check` for the containers of this cut."""
        return functools.partial(self.check, workdir=workdir)

    async def check(self, container: Container, workdir: str) -> None:
        """InfraError unless the container's repository is still what the cut left (run before the agent)."""
        if not self.base:
            return
        argv = " ".join(shlex.quote(a) for a in (workdir, self.base, self.ref, str(self.objects)))
        done = await container.exec(f"bash -c {shlex.quote(CHECK)} check {argv}", 60.0)
        if done.timed_out or done.returncode != 0:
            raise InfraError(f"container {container.id[:12]} of {self.image}: its repository is not the one cut at "
                             f"the base commit ({done.output.strip()[-300:] or 'timed out'}); not scored")


@dataclass
class HistoryGuard:
    """The cut images of one process's episodes (built once per image, working directory and base commit)."""

    containers: Containers

    def __post_init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def on(self) -> bool:
        return self.containers.settings.git_history == "base"

    async def start(self, task: Mapping[str, Any], image: str, episode_id: str) -> tuple[Container, dict[str, Any]]:
        """The episode's container — of the cut image when the guard is on, its repository checked — and the task
        with its `base_commit` as cut (a row that named none gets the image's HEAD, so scoring can restore files)."""
        workdir, base = str(task["workdir"]), str(task.get("base_commit") or "")
        cut = await self._cut_for(task, image)
        container = await self.containers.start(cut.image if cut else image, workdir, episode_id,
                                                cut.checker(workdir) if cut else None)
        return container, {**task, "base_commit": (cut.base if cut else "") or base}

    async def ahead(self, task: Mapping[str, Any], image: str, count: int) -> None:
        """`count` episodes of `task` are about to start: its cut image built and its containers started now."""
        workdir, cut = str(task["workdir"]), await self._cut_for(task, image)
        self.containers.ahead(cut.image if cut else image, workdir, count, cut.checker(workdir) if cut else None)

    async def _cut_for(self, task: Mapping[str, Any], image: str) -> Cut | None:
        """The task's cut of `image` when the guard is on."""
        return await self.cut(image, str(task["workdir"]), str(task.get("base_commit") or "")) if self.on else None

    async def cut(self, image: str, workdir: str, base: str) -> Cut:
        """`image` with its repository at `workdir` cut at `base`: built on first use (or when the image budget
        removed it), else read from its labels."""
        image_id = await self.containers.image_id(image)
        key = hashlib.sha256(json.dumps([VERSION, image_id, workdir, base]).encode()).hexdigest()[:16]
        tag = f"localhost/fullasync/at-base:{key}"
        async with self._locks.setdefault(key, asyncio.Lock()):
            found = await self._labels(tag)
            built = found is None
            if built:
                await self._build(tag, image_id, workdir, base)
                found = await self._labels(tag)
            if found is None:
                raise InfraError(f"the cut image {tag} of {image} was built but cannot be read back")
            self.containers.budget.used(tag)
        if built:
            await self.containers.budget.enforce(keep=tag)
        return found

    async def _labels(self, tag: str) -> Cut | None:
        executable = self.containers.settings.executable
        done = await run_cli([executable, "image", "inspect", "--format", "{{json .Config.Labels}}", tag], 60.0)
        if done.returncode != 0:
            return None
        labels = json.loads(done.output.strip().splitlines()[-1] or "null") or {}
        if f"{LABEL}.objects" not in labels:
            return None
        return Cut(tag, labels[f"{LABEL}.base"], labels[f"{LABEL}.ref"], int(labels[f"{LABEL}.objects"]))

    async def _build(self, tag: str, image_id: str, workdir: str, base: str) -> None:
        """Two builds without a network: the cut (its record printed), then the record as labels."""
        with tempfile.TemporaryDirectory(prefix="fullasync-cut-") as context:
            Path(context, "cut.sh").write_text(CUT)
            args = " ".join(shlex.quote(a) for a in (workdir, base))
            Path(context, "Containerfile").write_text(
                f"FROM {image_id}\nCOPY cut.sh /fullasync-cut.sh\n"
                f"RUN bash /fullasync-cut.sh {args} && rm -f /fullasync-cut.sh\n")
            cut = await self._podman_build(context, ["--iidfile", f"{context}/iid", "--no-cache"], image_id)
            record = _RECORD.findall(cut)
            if not record:
                raise InfraError(f"cutting the git history of {image_id[:19]} at {workdir} printed no record: "
                                 f"{cut.strip()[-300:]}")
            cut_base, ref, objects = record[-1]
            labels = {f"{LABEL}.base": cut_base, f"{LABEL}.ref": ref, f"{LABEL}.objects": objects, BUILT: "cut",
                      BUILT_FROM: image_id}
            Path(context, "Containerfile").write_text(
                f"FROM {Path(context, 'iid').read_text().strip()}\n"
                + "".join(f"LABEL {name}={json.dumps(value)}\n" for name, value in labels.items()))
            await self._podman_build(context, ["--tag", tag], image_id)

    async def _podman_build(self, context: str, options: list[str], image_id: str) -> str:
        settings = self.containers.settings
        done = await run_cli([settings.executable, "build", "--network=none", *options, context],
                             settings.build_timeout_s)
        if done.timed_out or done.returncode != 0:
            raise InfraError(f"cutting the git history of image {image_id[:19]} failed: "
                             f"{done.output.strip()[-800:] or 'timed out'}")
        return done.output
