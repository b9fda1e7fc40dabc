"""Event-loop lag of a simulated run, as a real-time loop would see it: each iteration's work, replayed.

Owns: `LoopWork`, the record of every loop iteration of a `VirtualClockLoop` (the simulated time it
ran at and the CPU time its callbacks took, on the loop thread's clock), and `replayed_lag`, which
turns that record into the lag a callback becomes-ready-then-waits on a real-time loop.
Does not own: the loop (`clock.py`) or what runs on it.

Why a replay: on a virtual clock the loop's time stands still while callbacks run and jumps to
the next timer when they are done, so a probe on the loop itself sees only the callbacks ready at
the very same simulated instant — a burst of work never delays the next instant's events, as it
would in real time. Replayed as a single server whose jobs are the iterations (arriving at their
simulated times, taking their measured CPU time), the loop is

    free_i  = max(arrival_i, free_{i−1}) + cpu_i
    lag(t)  = max(0, free after the last iteration arriving ≤ t − t)

— the wait of an event (an engine's reply, a request to the gateway) becoming ready at time t.
Sampled at uniform steps of simulated time, its percentiles are over the run's time, as a real
run experiences them; when the work per simulated second exceeds one core, the backlog grows
without bound (the driver cannot keep up in real time). CPU time, not wall time: a virtual-clock
loop never blocks while work is pending, so the thread's CPU clock measures the callbacks' cost
and leaves out the time other processes on a shared machine held the core. The record includes
the simulated engines' callbacks (they run on the same loop): an upper bound on the driver's own.

Work the driver hands to a worker thread (`infra.offload.off_loop`: the train batch, the step's statistics, the
release of a trained batch) runs in place on the virtual clock but is recorded apart (`LoopWork.offload`) and
replayed as a second job stream on the same interpreter lock: while both have work, each gets half the lock
(the lock changes hands at the switch interval), and an event that becomes ready while the worker holds the lock
waits one switch interval more. With loop backlog L and worker backlog W at time t, that is

    lag(t)  = L + min(L, W) + (switch interval if W > 0)

— the loop's backlog served at half speed for as long as the worker has work. No other core speeds either up:
a conservative model of a thread whose long C calls release the lock.
"""

from __future__ import annotations

import sys
import time
from array import array


class LoopWork:
    """Iterations of one loop: `tick(now)` each time the loop's select returns (one clock read per iteration).

    Iteration i's CPU time is the thread's CPU clock from its tick to the next: its callbacks and
    the next select call (the loop's own overhead, which a real loop pays too).
    """

    def __init__(self) -> None:
        self.arrivals = array("d")  # simulated time each iteration ran at
        self.stamps = array("d")  # the thread's CPU clock at the start of each iteration's callbacks
        self.offloaded: dict[int, float] = {}  # iteration → CPU seconds of its work that a worker thread would run

    def tick(self, now: float) -> None:
        self.arrivals.append(now)
        self.stamps.append(time.thread_time())

    def offload(self, cpu_s: float) -> None:
        """Part of the current iteration's CPU time was work a real run does in a worker thread."""
        iteration = len(self.stamps) - 1
        self.offloaded[iteration] = self.offloaded.get(iteration, 0.0) + cpu_s

    def mark(self) -> int:
        """Iterations completed so far (to cut a window out of the record)."""
        return max(0, len(self.stamps) - 1)


def tick_cost_s(samples: int = 20_000) -> float:
    """CPU seconds one `tick` costs (a CPU-clock read and two appends): the record's own overhead,
    which a run without it does not pay, so the driver's CPU is reported without it."""
    work = LoopWork()
    started = time.thread_time()
    for i in range(samples):
        work.tick(float(i))
    return (time.thread_time() - started) / samples


def replayed_lag(work: LoopWork, first: int, last: int, every_s: float,
                 switch_s: float | None = None) -> list[float]:
    """`lag(t)` of the module docstring, at every `every_s` of simulated time over iterations first..last
    (`switch_s`: the interpreter's switch interval, `sys.getswitchinterval()` unless given)."""
    arrivals, stamps, offloaded = work.arrivals, work.stamps, work.offloaded
    if last <= first:
        return []
    switch_s = sys.getswitchinterval() if switch_s is None else switch_s
    samples: list[float] = []
    t, end = arrivals[first], arrivals[last - 1]
    now, loop, worker = arrivals[first], 0.0, 0.0
    i = first
    while t < end:
        while i < last and arrivals[i] <= t:
            loop, worker = _served(loop, worker, arrivals[i] - now)
            now = arrivals[i]
            off = offloaded.get(i, 0.0)
            loop += max(0.0, stamps[i + 1] - stamps[i] - off)
            worker += off
            i += 1
        loop, worker = _served(loop, worker, t - now)
        now = t
        samples.append(loop + min(loop, worker) + (switch_s if worker > 0.0 else 0.0))
        t += every_s
    return samples


def _served(loop: float, worker: float, seconds: float) -> tuple[float, float]:
    """Backlogs after `seconds` on one lock: shared half and half while both have work, then whole."""
    both = min(seconds, 2.0 * min(loop, worker))
    loop, worker, seconds = loop - both / 2.0, worker - both / 2.0, seconds - both
    if loop > 0.0:
        return max(0.0, loop - seconds), worker
    return 0.0, max(0.0, worker - seconds)


def percentile(samples: list[float], fraction: float) -> float:
    """The `fraction` quantile of `samples` (nearest rank; 0.0 when there are none)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]

