"""A virtual clock for asyncio.

Owns: `VirtualClockLoop`, an event loop whose `time()` jumps straight to the next timer when
nothing is ready, so an hour of simulated sleeping takes as long as the Python work between the
sleeps; on request (`record_work`) it records each iteration's simulated time and CPU cost.
Does not own: what is simulated (see `engine.py`, `trainer.py`).

Why not Ray for the queue in a simulation: a virtual clock may only advance when every pending
event is a timer of this loop. An answer from another process arrives on a socket at a real time
the loop cannot know, so the simulated components must all live on this loop. Everything that
waits on the clock (`asyncio.sleep`, `wait_for`, `timeout`, `Condition` with a timeout) works
unchanged; code that reads `time.monotonic()` instead of `loop.time()` sees real time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fullasync.sim.loop_lag import LoopWork

T = TypeVar("T")


class _VirtualSelector:
    """Wraps the loop's selector: a wait for a timer becomes a jump of the virtual clock."""

    def __init__(self, selector: selectors.BaseSelector, loop: VirtualClockLoop) -> None:
        self._selector = selector
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        events = self._select(timeout)
        if self._loop.work is not None:
            self._loop.work.tick(self._loop.time())  # the iteration's callbacks run next, at this simulated time
        return events

    def _select(self, timeout: float | None) -> list:
        events = self._selector.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer pending: only real I/O can wake the loop
            return self._selector.select(None)
        self._loop.advance(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._selector, name)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on simulated time; use with `asyncio.Runner(loop_factory=VirtualClockLoop)`."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self.work: LoopWork | None = None  # each iteration's simulated time and CPU cost, once `record_work()`
        self._selector = _VirtualSelector(self._selector, self)  # type: ignore[has-type]

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)

    def record_work(self) -> LoopWork:
        """Start recording every iteration (for `loop_lag.replayed_lag`)."""
        self.work = LoopWork()
        return self.work


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` to completion on a fresh `VirtualClockLoop`."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main())
