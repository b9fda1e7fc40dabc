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
"""

from __future__ import annotations

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

    def tick(self, now: float) -> None:
        self.arrivals.append(now)
        self.stamps.append(time.thread_time())

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


def replayed_lag(work: LoopWork, first: int, last: int, every_s: float) -> list[float]:
    """`lag(t)` of the module docstring, at every `every_s` of simulated time over iterations first..last."""
    arrivals, stamps = work.arrivals, work.stamps
    if last <= first:
        return []
    samples: list[float] = []
    t, end = arrivals[first], arrivals[last - 1]
    free = arrivals[first]
    i = first
    while t < end:
        while i < last and arrivals[i] <= t:
            free = max(arrivals[i], free) + stamps[i + 1] - stamps[i]
            i += 1
        samples.append(max(0.0, free - t))
        t += every_s
    return samples


def percentile(samples: list[float], fraction: float) -> float:
    """The `fraction` quantile of `samples` (nearest rank; 0.0 when there are none)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]

