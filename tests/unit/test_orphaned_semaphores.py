"""A killed process tree's multiprocessing semaphores are removed at the run's end (fullasync.infra.shm); a
semaphore a live process holds, or one older than the run, stays."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from fullasync.infra.shm import SHM, remove_orphaned_semaphores

MAKE = "import _multiprocessing, os, signal, sys; lock = _multiprocessing.SemLock(1, 1, 1, sys.argv[1], False); "


def semaphore(tag: str) -> tuple[str, Path]:
    name = f"/mp-fullasync-test-{tag}-{uuid.uuid4().hex[:8]}"
    return name, SHM / f"sem{name.replace('/', '.')}"


def test_only_the_semaphores_of_killed_processes_made_since_the_run_began_are_removed():
    old_name, old = semaphore("old")
    subprocess.run([sys.executable, "-c", MAKE + "os.kill(os.getpid(), signal.SIGKILL)", old_name])
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # left by something before this run
    since = time.time() - 1
    leaked_name, leaked = semaphore("leaked")
    subprocess.run([sys.executable, "-c", MAKE + "os.kill(os.getpid(), signal.SIGKILL)", leaked_name])
    held_name, held = semaphore("held")
    holder = subprocess.Popen([sys.executable, "-c", MAKE + "print('ready', flush=True); sys.stdin.read()", held_name],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        assert leaked.exists() and held.exists() and old.exists()  # killed before its name was removed
        assert remove_orphaned_semaphores(since) >= 1
        assert not leaked.exists()
        assert held.exists()  # a live process maps it
        assert old.exists()  # not this run's
    finally:
        holder.kill()
        holder.wait()
        for path in (old, leaked, held):
            path.unlink(missing_ok=True)
