"""Semaphores a killed process tree leaves in /dev/shm, and their removal.

Owns: finding Python multiprocessing's named semaphores (`/dev/shm/sem.mp-*`) that no process maps any more, and
removing those a run's processes left.

Why: a process that spawns others (vLLM's engine core) names its semaphores in /dev/shm; the name is removed when
the lock is cleaned up at its creator's exit, or by the creator's resource tracker when the creator dies. Ray kills
an actor's whole process tree at once (`ray.kill`, a node's OOM killer, a lost worker), the tracker with it, so
nothing removes them: each engine killed leaves one behind, and a run that heals itself for days piles them up. A
semaphore no process maps is nobody's: every process holding its lock maps it. The sweep runs when the run's
engines and trainer have stopped, and takes only what appeared since the run began (a lock its creator dropped,
whose name waits for the creator's exit, is unmapped too: another program's, never the run's to take).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("fullasync")

SHM = Path("/dev/shm")
PREFIX = "sem.mp-"  # multiprocessing's semaphore names (`sem_open("/mp-...")` lives at /dev/shm/sem.mp-...)


def _mapped_inodes(device: int) -> set[int]:
    """The inodes on `device` that some process maps (every process this user may read). By inode, not name: glibc
    makes a semaphore as a temporary file, maps it and then links it to its name, so its creator's map names the
    temporary file, deleted."""
    field = f"{os.major(device):02x}:{os.minor(device):02x}"
    inodes: set[int] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # gone, or not ours to read
            continue
        for line in maps.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) >= 5 and parts[3] == field:
                inodes.add(int(parts[4]))
    return inodes


def orphaned_semaphores(since: float, shm: Path = SHM) -> list[Path]:
    """This user's multiprocessing semaphores made at or after `since` (a `time.time()`) that no process maps."""
    if not shm.is_dir():
        return []
    uid = os.getuid()
    candidates: dict[int, Path] = {}
    for path in shm.glob(f"{PREFIX}*"):
        try:
            stat = path.stat()
        except OSError:
            continue
        if stat.st_uid == uid and stat.st_mtime >= since:
            candidates[stat.st_ino] = path
    return unmapped(list(candidates.values()), shm)


def unmapped(paths: list[Path], shm: Path = SHM) -> list[Path]:
    """Those of `paths` (files under `shm`) that no process maps."""
    inodes = {}
    for path in paths:
        try:
            inodes[path.stat().st_ino] = path
        except OSError:  # gone
            continue
    if not inodes:
        return []
    mapped = _mapped_inodes(shm.stat().st_dev)
    return sorted(path for inode, path in inodes.items() if inode not in mapped)


def remove_orphaned_semaphores(since: float, shm: Path = SHM) -> int:
    """Remove what `orphaned_semaphores` finds; how many went (a log line says so when any did)."""
    removed = 0
    for path in orphaned_semaphores(since, shm):
        try:
            path.unlink()
            removed += 1
        except OSError:  # its creator removed it meanwhile
            continue
    if removed:
        log.info("removed %d semaphore(s) that killed processes left in %s", removed, shm)
    return removed
