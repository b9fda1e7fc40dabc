"""Work in proportion to a batch, kept off the driver's event loop.

Owns: `off_loop` (run a function in a worker thread, or in place on a loop that must, such as the simulator's
virtual clock) and `drop_piecewise` (release a large structure an item at a time). Does not own: what the work is
(the training loop, the trainer's batch).

Why both: a worker thread shares the interpreter lock with the loop, and the lock changes hands only between
bytecodes, at the switch interval. A single C call that runs long keeps it: freeing the sequences of 8,192
trajectories with their list is ~20 M references released in one call (~0.1 s). Emptying the list one pop at a time
lets the thread hand the lock over between pops (`bench/step_off_loop.py`: the loop's longest stall beside a
1,024 × 8 batch build, 10–11 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def off_loop(function: Callable[..., T], *args: object) -> T:
    """`function(*args)` in a worker thread, so that the loop serves every episode meanwhile: building and sharding
    the train batch of 8,192 trajectories held the loop 3.4–6.8 s, a stall of every reply and gateway request. A loop
    that must run it in place says how (`run_blocking_inline(function, *args)`: the simulator's virtual clock, whose
    order of events must not hang on a thread, and which records the work as a worker thread's)."""
    inline = getattr(asyncio.get_running_loop(), "run_blocking_inline", None)
    if inline is not None:
        return inline(function, *args)
    return await asyncio.to_thread(function, *args)


def drop_piecewise(*collections: list[Any]) -> None:
    """Empty each list one item at a time, so that each item's references are released by their own short call;
    for the items to be freed here, nothing else may hold them."""
    for items in collections:
        while items:
            items.pop()
