"""A virtual clock for asyncio.

Owns: `VirtualClockLoop`, an event loop whose `time()` jumps straight to the next timer when
nothing is ready, so an hour of simulated sleeping takes as long as the Python work between the
sleeps; on request (`record_work`) it records each iteration's simulated time and CPU cost.
Does not own: what is simulated (see `engine.py`, `trainer.py`).

Why not Ray for the queue in a simulation: a virtual clock may only advance when every pending
event is a timer of this loop. An answer from another process arrives on a socket at a real time
the loop cannot know, so the simulated components must all live on this loop. Everything that
waits on the clock (`asyncio.sleep`, `wait_for`, `timeout`, `Condition` with a timeout) works
unchanged; code that reads `time.monotonic()` instead of `loop.time()` sees real time. Work handed to a
thread (`asyncio.to_thread`, e.g. a checkpoint's file writes) holds the clock until it returns, as if it took no
simulated time.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

from fullasync.infra.offload import RunsBlockingInline
from fullasync.sim.loop_lag import LoopWork

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _VirtualSelector(selectors.BaseSelector):
    """Wraps the loop's selector: a wait for a timer becomes a jump of the virtual clock."""

    def __init__(self, selector: selectors.BaseSelector, loop: VirtualClockLoop) -> None:
        self._selector = selector
        self._loop = loop

    def register(self, fileobj: FileDescriptorLike, events: int, data: object = None) -> selectors.SelectorKey:
        return self._selector.register(fileobj, events, data)

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._selector.unregister(fileobj)

    def modify(self, fileobj: FileDescriptorLike, events: int, data: object = None) -> selectors.SelectorKey:
        return self._selector.modify(fileobj, events, data)

    def get_key(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._selector.get_key(fileobj)

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._selector.get_map()

    def close(self) -> None:
        self._selector.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._select(timeout)
        if self._loop.work is not None:
            self._loop.work.tick(self._loop.time())  # the iteration's callbacks run next, at this simulated time
        return events

    def _select(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._selector.select(0)
        if events or timeout == 0:
            return events
        if timeout is None or self._loop.executor_jobs:
            # no timer pending, or a worker thread runs (its result wakes the loop): only real I/O can wake it;
            # jumping to the next timer now would pass simulated time the worker's work did not take
            return self._selector.select(None)
        self._loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop, RunsBlockingInline):
    """An event loop on simulated time; use with `asyncio.Runner(loop_factory=VirtualClockLoop)`."""

    def __init__(self) -> None:
        self._now = 0.0
        self.work: LoopWork | None = None  # each iteration's simulated time and CPU cost, once `record_work()`
        self.executor_jobs = 0  # calls running in worker threads (`asyncio.to_thread`): the clock waits for them
        super().__init__(_VirtualSelector(selectors.DefaultSelector(), self))

    def time(self) -> float:
        return self._now

    def run_in_executor(self, executor: Executor | None, func: Callable[[*Ts], T],
                        *args: *Ts) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.executor_jobs += 1
        future.add_done_callback(self._executor_job_done)
        return future

    def _executor_job_done(self, _: asyncio.Future[T]) -> None:
        self.executor_jobs -= 1

    def run_blocking_inline(self, function: Callable[..., T], *args: object) -> T:
        """`infra.offload.off_loop` on this loop: in place, because which callbacks would run while a worker thread
        holds the clock depends on the thread's real timing, and a simulation must replay the same way each time. Its
        CPU time is recorded as a worker thread's (`LoopWork.offload`), not as the iteration's."""
        if self.work is None:
            return function(*args)
        started = time.thread_time()
        try:
            return function(*args)
        finally:
            self.work.offload(time.thread_time() - started)

    def advance(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)

    def record_work(self) -> LoopWork:
        """Start recording every iteration (for `loop_lag.replayed_lag`)."""
        self.work = LoopWork()
        return self.work


def run_virtual(main: Callable[[], Coroutine[object, None, T]]) -> T:
    """Run `main()` to completion on a fresh `VirtualClockLoop`."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main())
