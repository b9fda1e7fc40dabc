"""`run_process`: a harness process and everything it starts end with its episode."""

from __future__ import annotations

import asyncio
import sys

import psutil
import pytest

from fullasync.rollout.generator import run_process

SPAWNER = ("import os, subprocess, sys, time\n"
           "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
           "                         start_new_session=len(sys.argv) > 3)\n"
           "print(os.getpid(), child.pid, flush=True)\n"
           "open(sys.argv[1], 'w').write(f'{os.getpid()} {child.pid}')\n"
           "time.sleep(float(sys.argv[2]))\n")


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


async def gone(pids: list[int], within_s: float = 5.0) -> bool:
    """SIGKILL takes effect asynchronously: wait (briefly) until none of `pids` runs."""
    for _ in range(int(within_s / 0.05)):
        if not any(alive(pid) for pid in pids):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("own_session", [False, True])
async def test_cancelling_a_harness_kills_everything_it_started(tmp_path, own_session):
    """Also a child in a session of its own (harness shells often start one), out of the group's reach."""
    pid_file = tmp_path / "pids"
    extra = ("own-session",) if own_session else ()
    task = asyncio.create_task(run_process(sys.executable, "-c", SPAWNER, str(pid_file), "600", *extra))
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.1)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert all(alive(pid) for pid in pids)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(task, 0.5)  # the episode timeout
    assert await gone(pids)


async def test_a_harness_that_exits_leaves_no_child_behind(tmp_path):
    done = await run_process(sys.executable, "-c", SPAWNER, str(tmp_path / "pids"), "0")
    harness_pid, child_pid = (int(p) for p in done.stdout.split())
    assert done.returncode == 0 and done.pid == harness_pid
    assert await gone([child_pid])
