"""Process trees on Linux: find every descendant of a process and kill them all, leaving nothing behind.

Owns: `become_subreaper` (orphans of a harness reparent to it instead of init, so they stay findable),
`descendants` (read from /proc), `kill_tree` (stop the root, kill every descendant until none is left,
then the root) and `alive`. Harness code is free to start shells in their own sessions
(mini-swe-agent's `LocalEnvironment` does, `start_new_session=True`), so a process-group kill alone
would miss them; a subreaper root plus a /proc walk does not. Does not own: starting processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
KILL_DEADLINE_S = 10.0  # a tree that keeps forking, or is slow to die on a loaded machine, is swept this long
SWEEP_INTERVAL_S = 0.01  # between two sweeps: SIGKILL takes effect asynchronously


def become_subreaper() -> None:
    """Make the calling process the reaper of its orphaned descendants (Linux ≥ 3.4)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _parent_map() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process, read from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we read
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Live (non-zombie) descendants of `pid`, parents before children."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_map().items():
        children.setdefault(parent, []).append(child)
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop(0)
        for child in children.get(current, []):
            found.append(child)
            frontier.append(child)
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # already gone: nothing to do
        return


def kill_tree(root: int) -> None:
    """SIGKILL every descendant of `root`, then `root`.

    `root` is stopped first so it starts nothing new; while it lives (and is a subreaper), orphans of
    killed processes reparent to it and are found by the next sweep. Sweeps until no descendant is left;
    raises if some survive `KILL_DEADLINE_S` of sweeps.
    """
    _signal(root, signal.SIGSTOP)
    deadline = time.monotonic() + KILL_DEADLINE_S
    while (tree := descendants(root)) and time.monotonic() < deadline:
        for pid in tree:
            _signal(pid, signal.SIGKILL)
        time.sleep(SWEEP_INTERVAL_S)
    _signal(root, signal.SIGKILL)
    left = [pid for pid in descendants(root) if alive(pid)]
    if left:
        raise RuntimeError(f"processes {left} under {root} survived {KILL_DEADLINE_S:g} s of kill sweeps")
