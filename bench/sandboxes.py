"""Sandboxes at RL concurrency: containers started per minute, start latency and the time an episode waits for its
container, with the warm pool off and on.

Each run keeps C episodes in flight (`--concurrency`, one run per C and pool setting) on this host's podman, every
episode in a container of one task image (`Containers`, the code the SWE adapter runs: `max_starting` starts at
once, labels, no network): an episode asks for its container (`Containers.start`), runs one command in it, then
`--episode-s` seconds of agent time (a SWE episode spends minutes on model calls between its commands), and gives
it back (`Containers.finish`); each of the C workers runs `--episodes` episodes in turn. Pool on:
`container.warm_pool=C` (about the run's episodes in flight), refilled behind the image taken last. Measured per
episode: its wait (asking to holding a running container), and that wait's share of the episode (wait / (wait +
episode)); per run: containers started per minute (every start, the pool's included, over the run's wall time;
and, pool off, in the cold wave: C starts asked at once, over the time the last one took, the most this host starts)
and each start's latency (p50 / p99: the `podman run` with its queue for a starting place). The first wave is cold
in both settings (nothing is warm before a run's first episodes ask); the table gives the waits of the later
episodes, the steady state, beside all of them. The default episode (60 s of agent time) is short for a SWE episode
and still asks for C starts a minute; shorter ones (`--episode-s 10`) ask for more starts a minute than this host's
podman makes, and then no pool can hide the wait (the page says what was measured). A benchmark, not a test:
nothing is asserted; one run each, on an idle machine. Needs podman (`make setup-containers`).

    .venv/bin/python bench/sandboxes.py
    .venv/bin/python bench/sandboxes.py --concurrency 16,64 --episode-s 5 --episodes 2 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

from _report import report, run_note  # bench/ is on sys.path when run as a script

BEGIN, END = "<!-- sandboxes:begin -->", "<!-- sandboxes:end -->"
ROW = {"id": "bench-sandboxes", "image_recipe": {"files": {"task.py": "print('a task')\n"}}}


@dataclass
class Run:
    concurrency: int
    pool: bool
    waits: list[float] = field(default_factory=list)  # every episode's, in the order they asked
    later: list[float] = field(default_factory=list)  # those of each worker's second episode on
    first: list[float] = field(default_factory=list)  # each worker's first: the cold wave, all asking at once
    shares: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # each start's latency
    wall_s: float = 0.0
    taken: int = 0

    @property
    def per_minute(self) -> float:
        return 60 * len(self.starts) / self.wall_s

    @property
    def burst_per_minute(self) -> float:
        """The cold wave's C containers over the time its last one took: what this host starts at most."""
        return 60 * len(self.first) / max(self.first)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_run(concurrency: int, pool: bool, args: argparse.Namespace) -> Run:
    from fullasync_agents.containers import Containers, ContainerSettings

    containers = Containers(ContainerSettings(warm_pool=concurrency if pool else 0, max_starting=args.max_starting))
    image = await containers.image_for(ROW)
    run = Run(concurrency, pool)
    start_new = containers._start_new

    async def timed_start(*given):  # each podman run as the caller sees it, the pool's included
        began = time.perf_counter()
        container = await start_new(*given)
        if container is not None:
            run.starts.append(time.perf_counter() - began)
        return container

    containers._start_new = timed_start  # type: ignore[method-assign]
    if containers.pool is not None:
        containers.pool.start_new = timed_start

    async def worker(index: int) -> None:
        for episode in range(args.episodes):
            asked = time.perf_counter()
            container = await containers.start(image, "/testbed", f"bench-{index}-{episode}")
            wait = time.perf_counter() - asked
            done = await container.exec("cat task.py", 60.0)  # its first command
            assert done.returncode == 0, done.output
            run.waits.append(wait)
            (run.later if episode else run.first).append(wait)
            run.shares.append(wait / (wait + args.episode_s))
            await asyncio.sleep(args.episode_s)
            await containers.finish(container)

    began = time.perf_counter()
    await asyncio.gather(*(worker(index) for index in range(concurrency)))
    run.wall_s = time.perf_counter() - began
    run.taken = containers.pool.taken if containers.pool is not None else 0
    await containers.close()
    return run


def render(runs: list[Run], args: argparse.Namespace, note: str) -> str:
    lines = ["| episodes in flight | pool | wait, later episodes: mean / p99 (s) | wait, all: mean (s) | wait's share "
             "of an episode (later) | starts / min: run / cold wave | start latency p50 / p99 (s) | from the pool |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        later_shares = [wait / (wait + args.episode_s) for wait in run.later]
        lines.append(f"| {run.concurrency} | {'on' if run.pool else 'off'} | {statistics.mean(run.later):.3f} / "
                     f"{_quantile(run.later, 0.99):.3f} | {statistics.mean(run.waits):.3f} | "
                     f"{100 * statistics.mean(later_shares):.2f} % | {run.per_minute:.0f} / "
                     f"{'—' if run.pool else f'{run.burst_per_minute:.0f}'} | "
                     f"{_quantile(run.starts, 0.5):.2f} / {_quantile(run.starts, 0.99):.2f} | {run.taken} |")
    ratios = []
    by = {(run.concurrency, run.pool): run for run in runs}
    for concurrency in sorted({run.concurrency for run in runs}):
        off, on = by.get((concurrency, False)), by.get((concurrency, True))
        if off and on:
            ratios.append(f"{concurrency}: {statistics.mean(on.later) / statistics.mean(off.later):.3f}")
    return "\n".join([
        f"Episodes of {args.episode_s:g} s of agent time, {args.episodes} per worker, `max_starting="
        f"{args.max_starting}`; pool on: `warm_pool` = episodes in flight.", "", *lines, "",
        f"Later episodes' mean wait, pool on / off: {', '.join(ratios)}. Starts asked for a minute in the steady "
        f"state: {', '.join(f'{c}: {60 * c / args.episode_s:.0f}' for c in sorted({run.concurrency for run in runs}))}"
        " (episodes in flight × 60 / episode length; the pool adds its refills and those left warm at the end); the "
        "cold wave (pool off: C starts asked at once) is the most this host starts a minute.", "",
        note])


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    runs = []
    for concurrency in args.concurrency:
        for pool in (False, True):
            run = await one_run(concurrency, pool, args)
            print(f"{concurrency} in flight, pool {'on' if pool else 'off'}: later waits "
                  f"{statistics.mean(run.later):.3f} s, {run.per_minute:.0f} starts/min", flush=True)
            runs.append(run)
    report(render(runs, args, run_note(started)), BEGIN, END, not args.no_write)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=lambda text: [int(c) for c in text.split(",")], default=[16, 64, 128])
    parser.add_argument("--episode-s", type=float, default=60.0, help="agent time per episode")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per worker, in turn")
    parser.add_argument("--max-starting", type=int, default=4)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks/ alone")
    asyncio.run(main(parser.parse_args()))
