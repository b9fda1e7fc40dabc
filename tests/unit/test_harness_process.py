"""`run_process`: a harness process and everything it starts end with its episode."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from process_waits import alive, gone

from fullasync.rollout.generator import run_process

SPAWNER = ("import os, subprocess, sys, time\n"
           "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
           "                         start_new_session=len(sys.argv) > 3)\n"
           "print(os.getpid(), child.pid, flush=True)\n"
           "open(sys.argv[1], 'w').write(f'{os.getpid()} {child.pid}')\n"
           "time.sleep(float(sys.argv[2]))\n")


@pytest.mark.parametrize("own_session", [False, True])
async def test_cancelling_a_harness_kills_everything_it_started(tmp_path, own_session):
    """Also a child in a session of its own (harness shells often start one), out of the group's reach."""
    pid_file = tmp_path / "pids"
    extra = ("own-session",) if own_session else ()
    task = asyncio.create_task(run_process(sys.executable, "-c", SPAWNER, str(pid_file), "600", *extra))
    deadline = time.monotonic() + 60  # a bound on a hang: Python starts in well under a second
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
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
