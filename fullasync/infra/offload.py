"""Keeping the driver's event loop responsive: work in proportion to a batch off the loop, bursts spread.

Owns: `off_loop` (run a function in a worker thread, or in place on a loop that must, such as the simulator's
virtual clock), `first_of` (the first of several waits, the others cancelled), `drop_piecewise` (release a large
structure an item at a time) and `Pacer` (at most so many starts per interval, however many tasks ask at once). Does
not own: what the work is (the training loop, the trainer's batch, the rollouter's admission).

Why release piecewise: a worker thread shares the interpreter lock with the loop, and the lock changes hands only
between bytecodes, at the switch interval. A single C call that runs long keeps it: freeing the sequences of 8,192
trajectories with their list is ~20 M references released in one call (~0.1 s). Emptying the list one pop at a time
lets the thread hand the lock over between pops (`bench/step_off_loop.py`: the loop's longest stall beside a
1,024 × 8 batch build, 10–11 ms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def loop_time() -> float:
    """The running event loop's clock: `time.monotonic` on a normal loop, simulated time under fullasync.sim.

    Outside a running loop (an object built before the run starts) it is `time.monotonic`, the normal loop's clock.
    """
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class RunsBlockingInline:
    """A base of event loops that must run `off_loop`'s work in place (the simulator's virtual clock, whose order of
    events must not hang on a thread, and which records the work as a worker thread's)."""

    def run_blocking_inline(self, function: Callable[..., T], *args: object) -> T:
        raise NotImplementedError


async def off_loop(function: Callable[..., T], *args: object) -> T:
    """`function(*args)` in a worker thread, so that the loop serves every episode meanwhile: building and sharding
    the train batch of 8,192 trajectories held the loop 3.4–6.8 s, a stall of every reply and gateway request. A loop
    that must run it in place says so by its type (`RunsBlockingInline`)."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, RunsBlockingInline):
        return loop.run_blocking_inline(function, *args)
    return await asyncio.to_thread(function, *args)


async def first_of(waits: Iterable[Awaitable[object]], timeout_s: float | None = None) -> bool:
    """Wait until the first of `waits` is done (the others are cancelled); False if `timeout_s` passed first."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    if not tasks:
        return False
    try:
        done, _ = await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    return bool(done)


def drop_piecewise(*collections: list[Any]) -> None:
    """Empty each list one item at a time, so that each item's references are released by their own short call;
    for the items to be freed here, nothing else may hold them."""
    for items in collections:
        while items:
            items.pop()


class Pacer:
    """At most `burst` units of work start per `rest_s` of the loop's clock, across every task that asks: a burst of
    thousands (the episodes a push admits at once) is spread over windows instead of running in one loop iteration
    ahead of every reply. Each caller sleeps once, until its window (no polling); the
    units past a full window carry over to the next."""

    def __init__(self, burst: int, rest_s: float) -> None:
        if burst < 1 or rest_s <= 0:
            raise ValueError(f"Pacer(burst={burst}, rest_s={rest_s}): needs burst >= 1 and rest_s > 0")
        self.burst, self.rest_s = burst, rest_s
        self._window = float("-inf")  # start of the window being filled
        self._used = 0  # units started in it

    def delay(self, units: int = 1) -> float:
        """Seconds until `units` more may start (0.0: now); reserves them."""
        now = loop_time()
        if now >= self._window + self.rest_s:  # the last window is over: a new one opens now
            self._window, self._used = now, 0
        while self._used >= self.burst:
            self._window += self.rest_s
            self._used -= self.burst
        self._used += units
        return max(0.0, self._window - now)

    async def turn(self, units: int = 1) -> None:
        """Wait for the window in which `units` more may start."""
        wait = self.delay(units)
        if wait > 0.0:
            await asyncio.sleep(wait)
