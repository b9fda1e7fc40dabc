"""Process trees on Linux: find every descendant of a process and kill them all, leaving nothing behind.

Owns: `become_subreaper` (orphans of a harness reparent to it instead of init, so they stay findable),
`descendants` (read from /proc), `kill_tree` (stop the root, kill every descendant until each is dead or
doomed, then the root), `process_state` and `alive`. Harness code is free to start shells in their own sessions
(mini-swe-agent's `LocalEnvironment` does, `start_new_session=True`), so a process-group kill alone
would miss them; a subreaper root plus a /proc walk does not. A process the kernel has doomed (SIGKILL
pending, or in its exit) can never run user code again, though the kernel may hold it a while: in
uninterruptible I/O, or as a pid namespace's init waiting for its last process to be reaped. Does not own:
starting processes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PF_EXITING = 0x4  # <linux/sched.h>: the task is in do_exit
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)  # in /proc/<pid>/status's pending-signal masks
KILL_DEADLINE_S = 10.0  # a tree that keeps forking, or is slow to die on a loaded machine, is swept this long
DOOMED_GRACE_S = 5.0  # then descendants the kernel still holds after a kill are waited for this long, then logged
SWEEP_INTERVAL_S = 0.01  # between two sweeps: SIGKILL takes effect asynchronously

log = logging.getLogger("fullasync")


def become_subreaper() -> None:
    """Make the calling process the reaper of its orphaned descendants (Linux ≥ 3.4)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """(command, fields after it) of /proc/<pid>/stat — fields[0] is the state letter, [1] the parent pid,
    [6] the flags — or None once the process is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # the process ended while we read
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return None if fields[0] == "Z" else (stat[stat.index("(") + 1:stat.rindex(")")], fields)


def _parent_map() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process, read from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(entry.name)) is not None:
            parents[int(entry.name)] = int(stat[1][1])
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
    return _stat(pid) is not None


@dataclasses.dataclass(frozen=True)
class ProcessState:
    """What /proc says of one live process: enough to tell a doomed process from one that escaped a kill."""

    pid: int
    command: str
    state: str  # ps's letter: R running, S sleeping, D uninterruptible, T stopped, ...
    kernel_wait: str  # /proc/<pid>/wchan: the kernel function it sleeps in ("0" or "" when running or hidden)
    doomed: bool  # SIGKILL pending or already exiting: it will never run user code again

    def __str__(self) -> str:
        fate = "killed, still in the kernel" if self.doomed else "NOT killed"
        return f"{self.pid} ({self.command}, state {self.state}, waiting in {self.kernel_wait or '?'}, {fate})"


def process_state(pid: int) -> ProcessState | None:
    """`pid`'s state, or None once it is gone or a zombie."""
    stat = _stat(pid)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        kernel_wait = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:  # ended while we read
        return None
    if stat is None:
        return None
    command, fields = stat
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    doomed = bool(int(fields[6]) & PF_EXITING or pending & SIGKILL_BIT)
    return ProcessState(pid, command, fields[0], kernel_wait, doomed)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # already gone: nothing to do
        return


def _sweep(root: int, deadline_s: float) -> list[ProcessState]:
    """SIGKILL the descendants of `root` until every one left is doomed; those (possibly none).

    Raises RuntimeError if some are still not doomed after `deadline_s` (a tree forking faster than the sweeps).
    """
    deadline = time.monotonic() + deadline_s
    while True:
        tree = [state for pid in descendants(root) if (state := process_state(pid)) is not None]
        undoomed = [state for state in tree if not state.doomed]
        if not undoomed:
            return tree
        if time.monotonic() >= deadline:
            raise RuntimeError(f"processes under {root} survived {deadline_s:g} s of kill sweeps: "
                               + "; ".join(map(str, undoomed)))
        for state in undoomed:
            _signal(state.pid, signal.SIGKILL)
        time.sleep(SWEEP_INTERVAL_S)


def kill_tree(root: int, deadline_s: float = KILL_DEADLINE_S, doomed_grace_s: float = DOOMED_GRACE_S) -> None:
    """SIGKILL every descendant of `root`, then `root`; wait for the descendants to be gone.

    `root` is stopped first so it starts nothing new; while it lives (and is a subreaper), orphans of
    killed processes reparent to it and are found by the next sweep. Once every descendant is doomed (none
    can run or fork again), `root` is killed too: it may hold the zombie a doomed process waits for (a pid
    namespace's init exits only once each process of its namespace is reaped, and a process that entered the
    namespace from outside is reaped by its parent there — a stopped `root`, when it is a subreaper).
    Raises RuntimeError if a descendant is still not doomed after `deadline_s`; logs the descendants the kernel
    still holds after `doomed_grace_s` more.
    """
    _signal(root, signal.SIGSTOP)
    try:
        doomed = _sweep(root, deadline_s)
    finally:
        _signal(root, signal.SIGKILL)
    deadline = time.monotonic() + doomed_grace_s
    while (doomed := [now for state in doomed if (now := process_state(state.pid)) is not None]) \
            and time.monotonic() < deadline:
        time.sleep(SWEEP_INTERVAL_S)
    if doomed:
        log.warning("processes under %s were killed but the kernel still holds them after %g s: %s", root,
                    doomed_grace_s, "; ".join(map(str, doomed)))
