"""Waits on OS processes for tests: SIGKILL takes effect asynchronously, so a test polls until a deadline."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterable

import psutil


def alive(pid: int) -> bool:
    """The process runs (a zombie, killed and not yet reaped, counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def gone(pids: Iterable[int], deadline_s: float = 30.0) -> bool:
    """Poll until none of `pids` runs; False if some still run at the deadline (which only bounds a hang)."""
    pids = list(pids)
    deadline = time.monotonic() + deadline_s
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def none_running(pattern: str, deadline_s: float = 30.0) -> bool:
    """Poll until no process's command line matches `pattern`; False if one still does at the deadline."""
    deadline = time.monotonic() + deadline_s
    while subprocess.run(["pgrep", "-f", pattern], capture_output=True).stdout:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True
