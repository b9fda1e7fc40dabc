"""What building a train batch does to the driver's event loop: in place, or in a worker thread (`off_loop`).

Builds the verl trainer's batch (`fullasync.trainer.batch.build_batch`, then `shard_batch` over 4 ranks) for B groups
of n = 8 trajectories with the `long-tail` lengths (P = 256 prompt tokens, responses lognormal median 256, σ 1, cut
at 2,048), while a ticker task on the same loop sleeps 5 ms at a time and records how much later than asked it
wakes: the wait every reply and every gateway request would see — reported as the longest stall and the time spent
in stalls over 20 ms (a percentile over ticks would hide a stall: a loop held for 6 s ticks once in those 6 s). Each
mode runs twice, alternating, in one process, with the garbage collector set as a run's driver sets it
(`settled_heap`).

    .venv/bin/python bench/step_off_loop.py [--groups 128,1024]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import time
from collections.abc import Callable

from fullasync.infra.heap import settled_heap
from fullasync.infra.offload import off_loop
from fullasync.trainer.batch import build_batch, shard_batch
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

TICK_S = 0.005
STALL_S = 0.020


def groups_of(count: int, seed: int = 0) -> list[TrajectoryGroup]:
    rng = random.Random(seed)

    def trajectory() -> Trajectory:
        length = min(2048, max(1, int(rng.lognormvariate(5.545, 1.0))))  # median e^5.545 ≈ 256
        call = ModelCall(prompt_ids=tuple(range(1, 257)), output_ids=tuple(rng.randrange(1000) for _ in range(length)),
                         output_logprobs=(-1.0,) * length, output_versions=(3,) * length,
                         finish_reason=FinishReason.LENGTH)
        return Trajectory(calls=(call,), reward=float(rng.random() < 0.5))

    return [TrajectoryGroup(row_id=f"row-{g}", trajectories=tuple(trajectory() for _ in range(8)))
            for g in range(count)]


def prepare(groups: list[TrajectoryGroup]) -> None:
    shard_batch(build_batch(groups), 4, 1, 8)


async def measure(work: Callable[[], None], in_thread: bool) -> tuple[float, list[float]]:
    waits: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            asked = time.perf_counter()
            await asyncio.sleep(TICK_S)
            waits.append(time.perf_counter() - asked - TICK_S)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    if in_thread:
        await off_loop(work)
    else:
        work()
    took = time.perf_counter() - started
    await asyncio.sleep(0.05)
    done.set()
    await task
    return took, sorted(waits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="128,1024", help="B values (groups of 8 trajectories)")
    args = parser.parse_args()
    prepare(groups_of(2))  # imports and first-call costs outside the measurement
    print("| groups × 8 | where | build + shard s | longest stall ms | time in stalls > 20 ms, s | ticks |")
    print("|---|---|---|---|---|---|")
    for count in (int(g) for g in args.groups.split(",")):
        groups = groups_of(count)
        for in_thread in (False, True, False, True):
            with settled_heap():
                took, waits = asyncio.run(measure(functools.partial(prepare, groups), in_thread))
            where = "worker thread (off_loop)" if in_thread else "on the loop"
            stalled = sum(wait for wait in waits if wait > STALL_S)
            print(f"| {count} × 8 | {where} | {took:.2f} | {1e3 * waits[-1]:.0f} | {stalled:.2f} | {len(waits)} |",
                  flush=True)


if __name__ == "__main__":
    main()
