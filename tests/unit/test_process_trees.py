"""`kill_tree` on trees whose processes the kernel holds after SIGKILL: a pid namespace's init in its exit waits
until every process of its namespace is reaped, and one that entered the namespace from outside (`nsenter`, as
the Terminus sandbox's every command does) is reaped by its parent outside."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from process_waits import gone

from fullasync.rollout.processes import descendants, kill_tree

# A subreaper (as an episode process is) holding a pid namespace (as the Terminus sandbox's holder does) and a
# process inside it started from outside (as an exec's nsenter does); prints the namespace's init pid.
SANDBOX_LIKE = """
import subprocess, sys, time
from fullasync.rollout.processes import become_subreaper, descendants
become_subreaper()
holder = subprocess.Popen(["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--",
                           "sh", "-c", "sleep 600 & wait"])
while len(descendants(holder.pid)) < 2:
    time.sleep(0.01)
init = descendants(holder.pid)[0]
entered = subprocess.Popen(["nsenter", "--target", str(init), "--user", "--pid", "--", "sleep", "600"])
while not descendants(entered.pid):
    time.sleep(0.01)
print(init, flush=True)
time.sleep(600)
"""


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # gone already
        return


def start_sandbox_like() -> tuple[subprocess.Popen, int]:
    """The root process and its namespace's init, once all of the tree runs."""
    root = subprocess.Popen([sys.executable, "-c", SANDBOX_LIKE], stdout=subprocess.PIPE, text=True)
    assert root.stdout is not None  # piped
    return root, int(root.stdout.readline())


async def test_a_namespace_init_waiting_on_a_zombie_its_stopped_root_holds_dies_with_the_root():
    """The sweeps kill `nsenter`; its child in the namespace (killed too) is reparented to the stopped root, a
    subreaper, which cannot reap it; the init waits for that. Killing the root once all is doomed frees it at once:
    the sweeps do not wait out their deadline (then the init might still be listed when the root was killed)."""
    root, init = start_sandbox_like()
    tree = descendants(root.pid)
    assert init in tree and len(tree) >= 5  # unshare, init, its sleep, nsenter, the sleep it entered
    kill = f"from fullasync.rollout.processes import kill_tree; kill_tree({root.pid}, deadline_s=600)"
    try:
        done = subprocess.run([sys.executable, "-c", kill], capture_output=True, text=True, timeout=60)  # bounds a hang
    finally:
        for pid in [root.pid, *tree]:  # all dead already, unless the bound tripped
            kill_quietly(pid)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # no error, nothing left for the kernel to hold
    assert root.wait(timeout=30) == -signal.SIGKILL
    assert await gone(tree)


async def test_a_process_the_kernel_still_holds_after_the_kill_is_reported_with_its_state(caplog):
    """Here the zombie's parent is outside the killed tree and stopped: the init cannot end until it goes on."""
    unshare = subprocess.Popen(["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--",
                                "sh", "-c", "sleep 600 & wait"])
    deadline = time.monotonic() + 30  # bounds a hang: these start in milliseconds
    while len(descendants(unshare.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    init = descendants(unshare.pid)[0]
    outside = subprocess.Popen(["nsenter", "--target", str(init), "--user", "--pid", "--", "sleep", "600"])
    while not descendants(outside.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(outside.pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="fullasync"):
            kill_tree(unshare.pid, doomed_grace_s=0.5)  # returns: the init can never run user code again
        [record] = caplog.records
        assert f"{init} (sh, state " in record.message and "killed, still in the kernel" in record.message
    finally:
        os.kill(outside.pid, signal.SIGCONT)  # reaps its child: the init's exit completes
    assert outside.wait(timeout=30) == -signal.SIGKILL  # killed with the namespace it entered
    assert await gone([init])
    assert unshare.wait(timeout=30) == -signal.SIGKILL
