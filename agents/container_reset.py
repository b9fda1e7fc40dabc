"""A verified reset: one container serving a group's episodes in turn, nothing of one episode reaching the next.

Owns: `Baseline` — what a fresh container of the image looks like, recorded at its start (the filesystem's
changes against the image as `podman diff` lists them, the pid of its `sleep`, the repository's HEAD, its `.git`
files outside the object store and every file's hash); and `reset` — after an episode: canary files written in the
repository, `/tmp`, `$HOME` and `/var/tmp`, every process but the container's own killed, the repository's files
at HEAD and its refs, config and logs put back as they were, every path the episode added removed (as `podman
diff` sees them: untracked files, new refs and objects, shell history, caches), then verified from the host:
nothing added or deleted beyond the baseline, every changed file either a tracked file git finds clean, the index,
a loose object whose content hashes to its name, or a `.git` file whose hash is the baseline's; no process left,
no canary left. Anything else is a dirty reset: the caller quarantines (removes) the container. Does not own: when
a container is reused (`fullasync_agents.container_pool`) or the history record (`swe_tasks.history`).
"""

from __future__ import annotations

import json
import secrets
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fullasync_agents.containers import Container

CANARY = ".fullasync-canary"  # written where an episode could leave something, then checked gone

# Printed at a fresh start: the sleep's pid, HEAD (or nothing), a tar of .git but its objects and index (base64),
# then "<sha256>  <path>" of each .git file outside the object store and "-  <path>" of each in it.
_RECORD = r"""
workdir=$1
for d in /proc/[0-9]*; do
  p=${d#/proc/}; [ "$p" = 1 ] && continue
  [ "$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)" = "sleep infinity " ] && { echo "$p"; break; }
done
git -C "$workdir" rev-parse -q --verify HEAD 2>/dev/null || echo
[ -d "$workdir/.git" ] && tar c -C "$workdir/.git" --exclude=./objects --exclude=./index . | base64 -w0
echo
[ -d "$workdir/.git" ] && find "$workdir/.git" -path "$workdir/.git/objects" -prune -o -type f -print0 \
  | xargs -0 -r sha256sum && find "$workdir/.git/objects" -type f -printf '-  %p\n'
exit 0
"""

# After an episode: canaries, processes, the repository at HEAD. Args: workdir, the sleep's pid, HEAD, the canary;
# the baseline's tar of .git on stdin.
_CLEAN = r"""
workdir=$1 keep=$2 head=$3 canary=$4
git() { command git -c core.fsmonitor= -c core.hooksPath=/dev/null "$@"; }
for place in "$workdir" /tmp /var/tmp "$HOME"; do [ -d "$place" ] && echo "$canary" > "$place/.fullasync-canary"; done
mine=" 1 $keep "; p=$$
while [ -n "$p" ] && [ "$p" != 0 ]; do mine="$mine$p "; p=$(grep -s '^PPid:' "/proc/$p/status" | cut -f2); done
for round in 1 2 3 4 5; do
  left=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; case "$mine" in *" $p "*) continue;; esac
    kill -9 "$p" 2>/dev/null && left=1
  done
  [ "$left" = 0 ] && break
done
if [ -n "$head" ]; then  # the index and files at HEAD, then its refs, config and logs as they were (stdin)
  cd "$workdir" && git reset -q --hard "$head" && base64 -d | tar x -C .git || { echo "git reset failed"; exit 3; }
fi
exit 0
"""

# Removes what the episode added ("A<path>", NUL-separated on stdin) and the files it made again ("C<path>").
_REMOVE = r"""
while IFS= read -r -d '' entry || [ -n "$entry" ]; do
  path=${entry:1}
  case "$entry" in A*) rm -rf -- "$path";; C*) [ -d "$path" ] || rm -f -- "$path";; esac
done
"""

# After the removal: prints one line per problem (a changed loose object is checked against its name: git freshens
# the objects it writes again); the changed paths (NUL-separated) on stdin. Args: workdir, the
# sleep's pid, HEAD.
_VERIFY = r"""
workdir=$1 keep=$2 head=$3
git() { command git -c core.fsmonitor= -c core.hooksPath=/dev/null "$@"; }
loose() {  # a loose object whose content hashes to its name
  command -v python3 > /dev/null && python3 -c 'import hashlib, sys, zlib
name = "".join(sys.argv[1].split("/")[-2:])
data = zlib.decompress(open(sys.argv[1], "rb").read())
sys.exit(getattr(hashlib, "sha1" if len(name) == 40 else "sha256")(data).hexdigest() != name)' "$1"
}
mine=" 1 $keep "; p=$$
while [ -n "$p" ] && [ "$p" != 0 ]; do mine="$mine$p "; p=$(grep -s '^PPid:' "/proc/$p/status" | cut -f2); done
for d in /proc/[0-9]*; do
  p=${d#/proc/}; case "$mine" in *" $p "*) continue;; esac
  [ -e "$d" ] && echo "process $p ($(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)) still runs"
done
for place in "$workdir" /tmp /var/tmp "$HOME"; do
  [ -e "$place/.fullasync-canary" ] && echo "canary left in $place"
done
if [ -n "$head" ]; then
  cd "$workdir" || exit 0
  [ "$(git rev-parse -q --verify HEAD)" = "$head" ] || echo "HEAD is not $head"
  [ -z "$(git status --porcelain --untracked-files=all 2>&1)" ] || echo "the working tree is not clean"
fi
while IFS= read -r -d '' path; do
  [ -z "$path" ] && continue
  [ -d "$path" ] && [ ! -L "$path" ] && continue
  case "$path" in
    "$workdir/.git/index") continue;;
    "$workdir/.git/objects/"??/*) loose "$path" && continue;;
    "$workdir/.git/"*) echo "git:$path"; continue;;
    "$workdir/"*) [ -n "$head" ] && git -C "$workdir" ls-files --error-unmatch -- "${path#$workdir/}" >/dev/null 2>&1 \
                   && continue;;
  esac
  echo "changed: $path"
done
exit 0
"""


@dataclass(frozen=True)
class Diff:
    """`podman diff` of a container: paths added, changed and deleted against its image."""

    added: frozenset[str]
    changed: frozenset[str]
    deleted: frozenset[str]


@dataclass(frozen=True)
class Baseline:
    """A fresh container of the image, as `reset` must leave it."""

    diff: Diff
    sleep_pid: str
    head: str  # the repository's HEAD at the start ("" when the working directory is not a repository)
    git_files: str  # its .git but the objects and the index: a tar, base64
    git_hashes: dict[str, str]  # every `.git` file -> its sha256 ("-" in objects/)


async def diff(container: Container) -> Diff:
    done = await container.cli("diff", "--format", "json")
    if done.returncode != 0:
        raise ValueError(f"podman diff failed: {done.output.strip()[-300:]}")
    found = json.loads(done.output[done.output.index("{"):] if "{" in done.output else "{}")
    return Diff(*(frozenset(found.get(kind) or ()) for kind in ("added", "changed", "deleted")))


async def baseline(container: Container) -> Baseline:
    """Record a container that has run nothing yet."""
    done = await container.exec(f"bash -c {shlex.quote(_RECORD)} record {shlex.quote(container.workdir)}", 60.0)
    lines = done.output.splitlines()
    if done.returncode != 0 or len(lines) < 3 or not lines[0].isdigit():
        raise ValueError(f"recording container {container.id[:12]} failed: {done.output.strip()[-300:]}")
    hashes = {path: digest for digest, _, path in (line.partition("  ") for line in lines[3:]) if path}
    return Baseline(await diff(container), lines[0], lines[1].strip(), lines[2].strip(), hashes)


async def reset(container: Container, base: Baseline) -> list[str]:
    """Put `container` back as `base` recorded it after an episode; the problems found (empty: a clean reset)."""
    workdir, canary = container.workdir, secrets.token_hex(16)
    args = " ".join(shlex.quote(a) for a in (workdir, base.sleep_pid, base.head, canary))
    done = await container.exec(f"bash -c {shlex.quote(_CLEAN)} clean {args}", 120.0, stdin=base.git_files.encode())
    if done.timed_out or done.returncode != 0:
        return [f"cleaning failed: {done.output.strip()[-300:] or 'timed out'}"]
    found = await diff(container)
    git_dir = f"{workdir.rstrip('/')}/.git/"
    # a path the image's top layer deleted and the episode made again shows as changed: a file under .git the
    # baseline did not have goes like an added one
    revived = {path for path in found.changed - base.diff.changed
               if path.startswith(git_dir) and path not in base.git_hashes}
    entries = [f"A{path}" for path in sorted(found.added - base.diff.added)] + [f"C{path}" for path in sorted(revived)]
    if entries:
        removed = await container.exec(f"bash -c {shlex.quote(_REMOVE)}", 120.0, stdin="\0".join(entries).encode())
        if removed.returncode != 0:
            return [f"removing what the episode added failed: {removed.output.strip()[-300:]}"]
    after = await diff(container)
    problems = [f"added: {path}" for path in sorted(after.added - base.diff.added)]
    problems += [f"deleted: {path}" for path in sorted(after.deleted - base.diff.deleted)]
    changed = "\0".join(sorted(after.changed - base.diff.changed)) + "\0"
    checked = await container.exec(f"bash -c {shlex.quote(_VERIFY)} verify {args.rsplit(' ', 1)[0]}", 120.0,
                                   stdin=changed.encode())
    lines = checked.output.splitlines()
    problems += [line for line in lines if not line.startswith("git:")]
    git_files = [line[4:] for line in lines if line.startswith("git:")]
    if git_files:  # .git files the tar put back: each must be the baseline's
        hashed = await container.exec("xargs -0 -r sha256sum --", 120.0, stdin="\0".join(git_files).encode())
        now = {path: digest for digest, _, path in (line.partition("  ") for line in hashed.output.splitlines())}
        problems += [f"changed: {path}" for path in git_files if now.get(path) != base.git_hashes.get(path)]
    return problems if checked.returncode == 0 else [*problems, f"verifying failed: {checked.output[-300:]}"]
