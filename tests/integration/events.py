"""Moments a test makes happen instead of hoping for: a generation frozen mid-way, processes gone.

A test that needs something to happen while a generation runs (a push during a call, a kill during a stream)
freezes the engine at a moment it chose, does the thing, and lets the engine go on; a test that waits for
something asynchronous (a SIGKILL taking effect, a request reaching the engine) polls for it until a generous
deadline, which only bounds a hang. Nothing here depends on one thing being slower than another.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from process_waits import gone  # noqa: F401  (re-exported for the integration tests)

from fullasync.contracts.engine import PauseMode

POLL_S = 0.01  # how long the engine runs between two looks at its progress while a test waits to freeze it


async def wait_for_tokens(engine, prefix: str, at_least: int, not_request: str | None = None,
                          deadline_s: float = 120.0) -> str:
    """Poll until an in-flight request whose id starts with `prefix` (other than `not_request`) has `at_least`
    tokens; its id. Use only where the generation may run on unfrozen: to act mid-way, `frozen_mid_generation`."""
    async with asyncio.timeout(deadline_s):
        while True:
            for request_id, count in (await engine.in_flight_tokens()).items():
                if request_id.startswith(prefix) and request_id != not_request and count >= at_least:
                    return request_id
            await asyncio.sleep(POLL_S)


async def freeze_mid_generation(engine, prefix: str, at_least: int, budget: int, not_request: str | None = None,
                                deadline_s: float = 120.0) -> str:
    """Pause `engine` (KEEP) at a moment when a request whose id starts with `prefix` (other than `not_request`)
    has at least `at_least` of its `budget` tokens and fewer than half: it is in flight and far from done, so no
    finish is in transit. Returns its id with the engine paused: a push now (ABORT) interrupts that request, and
    the caller resumes the engine (`frozen_mid_generation` does both in order).

    Once the request is in flight the engine only runs for short windows between two looks, paused at each look,
    so the request cannot run from `at_least` past half its budget unseen, whatever the machine's speed."""
    limit = budget // 2
    if at_least >= limit:
        raise ValueError(f"at_least={at_least} must be below half the budget ({limit}) to freeze far from done")
    try:
        async with asyncio.timeout(deadline_s):
            await wait_for_tokens(engine, prefix, 0, not_request, deadline_s)  # in flight: look closely from now
            while True:
                await engine.pause(PauseMode.KEEP)  # nothing advances while this looks
                counts = {request_id: count for request_id, count in (await engine.in_flight_tokens()).items()
                          if request_id.startswith(prefix) and request_id != not_request}
                for request_id, count in counts.items():
                    if at_least <= count < limit:
                        return request_id
                if any(count >= limit for count in counts.values()):
                    raise AssertionError(f"a request of {prefix} ran past {limit} of {budget} tokens between two "
                                         f"looks {POLL_S} s apart: {counts}")
                await engine.resume()
                await asyncio.sleep(POLL_S)
    except BaseException:
        await engine.resume()
        raise


@asynccontextmanager
async def frozen_mid_generation(engine, prefix: str, at_least: int, budget: int, not_request: str | None = None,
                                deadline_s: float = 120.0) -> AsyncIterator[str]:
    """`freeze_mid_generation`, then the body (a push, a kill), then resume the engine whatever happened, so a
    failing test cannot leave a shared engine paused. Yields the frozen request's id."""
    request_id = await freeze_mid_generation(engine, prefix, at_least, budget, not_request, deadline_s)
    try:
        yield request_id
    finally:
        await engine.resume()


