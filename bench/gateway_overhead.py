"""Tokens/s through the HTTP gateway vs the in-process client, in one run (ratios).

Same engine (vLLM, the tiny model), same chat requests (EOS ignored), non-streaming and streaming, at 1,
64 and 256 concurrent episodes. The in-process path is a `rollout_fn`'s: the client in the driver's event
loop. The gateway path is a harness's: the `openai` SDK in a process of its own (bench/_gateway_load.py),
one base URL per episode, over loopback HTTP to the gateway in the driver's loop — so the SDK's own
parsing is not counted against the gateway, as with a real harness.

Load is closed-loop, as in a rollout: each episode keeps its client (in-process) or its SDK client and
connection (gateway) over its turns and sends its next request as soon as its last one is answered. Each path's
rate is the tokens of the requests answered in a window of `--seconds` after `--warmup` seconds of the same load
(`_timing.sustained`): steady load, without the start (every episode sending at once) or the drain. The paths
take turns `--rounds` times, the first alternating, so drift hits both alike; the ratio's ± is the standard error
of the rounds' ratios. The driver runs as a run's does (`settled_heap`). Settings (`--settings`):
- cores *shared*: every process may use every core (the engine with one thread per core); *split*: the
  engine alone on every core but the last, the driver and the harness process on the last — a cluster's
  arrangement, where a harness's CPU does not take the engine's;
- lengths *fixed*: every response `--max-tokens` long, so episodes move in lockstep and every request's
  CPU (SDK, HTTP, client) falls between two engine batches; *varied*: lognormal around it (σ 1, as the
  long-tail workload), the same sequence on both paths, so that CPU overlaps decoding as in a rollout.
Asserts nothing; writes its section of docs/benchmarks/gateway-overhead.md unless --no-write.

    .venv/bin/python bench/gateway_overhead.py [--max-tokens 32] [--rounds 3] [--seconds 8] [--warmup 3]
                                         [--episodes 1,64,256] [--settings shared-fixed,shared-varied,split-varied]
                                         [--stream-intervals 1,8]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import report, run_note
from _timing import MESSAGES, completion_tokens, mean_se, sustained, tiny_engine_service, turn_length

from fullasync.gateway import Gateway
from fullasync.infra.heap import settled_heap

BENCH = Path(__file__).resolve().parent
BEGIN, END = "<!-- gateway-overhead:begin -->", "<!-- gateway-overhead:end -->"
VARIED_SIGMA = 1.0  # as the long-tail workload's lengths (fullasync.sim.workload)


class HarnessProcess:
    """The SDK side, in its own interpreter: `load()` runs its episodes for a while."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls) -> HarnessProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(BENCH / "_gateway_load.py"), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        return cls(process)

    def cpu_s(self) -> float:
        """CPU seconds the harness process has used so far (user + system, from /proc)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def _ask(self, command: dict) -> dict:
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError("the harness process ended early; run bench/_gateway_load.py alone to see why")
        return json.loads(line)

    async def load(self, urls: list[tuple[str, str]], request: dict, stream: bool, window: Window,
                   sigma: float) -> tuple[dict, float]:
        """The harness process's answer (`_gateway_load.py`) and the CPU seconds it used."""
        harness_cpu = self.cpu_s()
        answer = await self._ask({"urls": urls, "request": request, "stream": stream, "seconds": window.seconds,
                                  "warmup": window.warmup, "sigma": sigma})
        return answer, self.cpu_s() - harness_cpu

    async def close(self, urls: list[str]) -> None:
        await self._ask({"close": urls})

    async def stop(self) -> None:
        self.process.stdin.write(b"\n")
        await self.process.stdin.drain()
        await self.process.wait()


@dataclass(frozen=True)
class Setting:
    """Where the processes run and how long the responses are."""

    split: bool  # the engine alone on its cores (split_cores), else every process on every core
    sigma: float  # σ of the responses' lognormal lengths (`_timing.turn_length`); 0: all the same length

    @classmethod
    def parse(cls, text: str) -> Setting:
        cores, _, lengths = text.partition("-")
        if cores not in ("shared", "split") or lengths not in ("fixed", "varied"):
            raise SystemExit(f"unknown setting {text!r}: use shared|split - fixed|varied, e.g. split-varied")
        return cls(cores == "split", VARIED_SIGMA if lengths == "varied" else 0.0)

    @property
    def label(self) -> str:
        return f"{'split' if self.split else 'shared'} cores, {'varied' if self.sigma else 'fixed'} lengths"


@dataclass(frozen=True)
class Window:
    """Each path's load per round: `warmup` seconds unmeasured, then `seconds` whose answers count."""

    seconds: float
    warmup: float

    @classmethod
    def once(cls) -> Window:
        return cls(0.0, 0.0)  # one request per episode, nothing counted


@dataclass(frozen=True)
class Load:
    """One path's share of a round: the tokens answered in its window, every token it produced, CPU seconds."""

    tokens: int
    window: Window
    produced: int
    driver_cpu_s: float
    harness_cpu_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.window.seconds


async def in_process_load(clients: list, request: dict, stream: bool, window: Window, sigma: float) -> Load:
    def send(episode: int, turn: int) -> Any:
        length = turn_length(episode, turn, request["max_tokens"], sigma)
        return completion_tokens(clients[episode].chat.completions, {**request, "max_tokens": length}, stream)

    cpu = time.process_time()
    tokens, produced = await sustained(send, len(clients), window.seconds, window.warmup)
    return Load(tokens, window, produced, time.process_time() - cpu)


async def gateway_load(harness: HarnessProcess, episodes: list, request: dict, stream: bool, window: Window,
                       sigma: float) -> Load:
    cpu = time.process_time()
    answer, harness_cpu = await harness.load([(e.base_url, e.api_key) for e in episodes], request, stream, window,
                                             sigma)
    return Load(answer["tokens"], window, answer["produced"], time.process_time() - cpu, harness_cpu)


async def measure_point(service, gateway: Gateway, harness: HarnessProcess, request: dict, stream: bool,
                        concurrency: int, rounds: int, window: Window, sigma: float) -> dict:
    """One row: `concurrency` episodes per path, kept over the rounds (an agent's turns), each sending its next
    request when its last is answered; one unmeasured request per episode first (connections, SDK clients);
    then the paths take turns, one window of load each per round, the first path alternating."""
    clients = [service.client() for _ in range(concurrency)]
    episodes = [gateway.open_episode() for _ in range(concurrency)]
    paths = {"client": lambda: in_process_load(clients, request, stream, window, sigma),
             "gateway": lambda: gateway_load(harness, episodes, request, stream, window, sigma)}
    loads: dict[str, list[Load]] = {name: [] for name in paths}
    try:
        await in_process_load(clients, request, stream, Window.once(), sigma)
        await gateway_load(harness, episodes, request, stream, Window.once(), sigma)
        for round_ in range(rounds):
            for name in list(paths) if round_ % 2 == 0 else reversed(paths):
                loads[name].append(await paths[name]())
    finally:
        await harness.close([e.base_url for e in episodes])
        for episode in episodes:
            gateway.close_episode(episode)
    ratios = [g.tokens_per_s / c.tokens_per_s for c, g in zip(loads["client"], loads["gateway"], strict=True)]

    def rate(name: str) -> float:
        return sum(load.tokens for load in loads[name]) / sum(load.window.seconds for load in loads[name])

    def per_token_us(name: str, cpu_s: Callable[[Load], float]) -> float:
        return 1e6 * sum(map(cpu_s, loads[name])) / sum(load.produced for load in loads[name])

    return {"episodes": concurrency, "stream": stream, "client_tps": rate("client"), "gateway_tps": rate("gateway"),
            "ratio": rate("gateway") / rate("client"), "ratio_se": mean_se(ratios)[1],
            "client_us": per_token_us("client", lambda load: load.driver_cpu_s),
            "gateway_us": per_token_us("gateway", lambda load: load.driver_cpu_s),
            "harness_us": per_token_us("gateway", lambda load: load.harness_cpu_s)}


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue  # ended meanwhile
            children.setdefault(parent, []).append(int(entry.name))
    return children


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` (threads it starts later inherit the set)."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            pass


def split_cores(harness_pid: int) -> tuple[set[int], set[int]]:
    """The engine (every process this one started but the harness: Ray and the engine actor) on all cores but
    the last; this process and the harness on the last, as on a cluster where the engine has its own device."""
    cores = sorted(os.sched_getaffinity(0))
    engine_cpus, ours = set(cores[:-1]), {cores[-1]}
    children, stack = _children(), [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            if child != harness_pid:
                _pin(child, engine_cpus)
    _pin(harness_pid, ours)
    _pin(os.getpid(), ours)
    return engine_cpus, ours


async def measure(max_tokens: int, rounds: int, window: Window, concurrencies: list[int],
                  setting: Setting, intervals: list[int]) -> list[dict]:
    cores, split = sorted(os.sched_getaffinity(0)), setting.split
    if split:  # before the engine starts: its thread count follows (fullasync.infra.platform)
        os.environ["FULLASYNC_ENGINE_THREADS"] = str(len(cores) - 1)
    engine, service = await tiny_engine_service()
    with settled_heap():  # as a run's driver (`AsyncAgentTrainer.run`): start-up objects frozen, rare collections
        gateway = Gateway(service)
        await gateway.start()
        harness = await HarnessProcess.start()
        if split:
            engine_cpus, ours = split_cores(harness.process.pid)
            print(f"engine on cores {sorted(engine_cpus)} ({len(engine_cpus)} threads); driver and harness on "
                  f"{sorted(ours)}", flush=True)
        request = dict(model="policy", messages=MESSAGES, max_tokens=max_tokens, extra_body={"ignore_eos": True})
        rows = []
        try:
            for concurrency in concurrencies:
                for stream, interval in [(False, 1)] + [(True, i) for i in intervals]:
                    # both paths share the service: the interval applies to both (as vLLM's --stream-interval would)
                    service.config = dataclasses.replace(service.config, stream_interval=interval)
                    row = await measure_point(service, gateway, harness, request, stream, concurrency, rounds, window,
                                              setting.sigma)
                    row["setting"], row["interval"] = setting.label, interval
                    rows.append(row)
                    body = f"stream/{interval}" if stream else "json"
                    print(f"{concurrency:>8} {body:>9} {row['client_tps']:>10.0f} {row['gateway_tps']:>10.0f} "
                          f"{row['ratio']:>6.2f} ±{row['ratio_se']:>5.2f} {row['client_us']:>9.0f} "
                          f"{row['gateway_us']:>9.0f} {row['harness_us']:>9.0f}", flush=True)
        finally:
            await harness.stop()
            await gateway.stop()
            await engine.shutdown()
            if split:
                os.environ.pop("FULLASYNC_ENGINE_THREADS")
                _pin(os.getpid(), set(cores))
    return rows


def _body(row: dict) -> str:
    if not row["stream"]:
        return "JSON"
    interval = row.get("interval", 1)
    return "SSE stream" if interval == 1 else f"SSE stream, interval {interval}"


def render(rows: list[dict], note: str) -> str:
    lines = [
        "## Gateway overhead",
        "",
        "Tokens/s of the same chat requests through the gateway (the `openai` SDK in a separate process, one base "
        "URL per episode, loopback HTTP) and through the in-process client (a `rollout_fn`), on one vLLM engine "
        "with the tiny model. Closed-loop load: each episode keeps its client and connection and sends its next "
        "request when its last is answered; a path's tokens/s counts the answers inside a window of steady load "
        "(after a warm-up, before the drain); the paths take turns, the first alternating, and ± is the standard "
        "error of the rounds' ratios. The driver runs as a run's does (`settled_heap`). Goals: ≥ 0.97 at 1 "
        "episode; ≥ 0.95 at 64 and 256 with split cores, ≥ 0.85 shared (issue 28).",
        "",
        "| setting | episodes | response | in-process tok/s | gateway tok/s | gateway ÷ in-process | driver CPU "
        "µs/token in-process | through the gateway | harness process CPU µs/token |",
        "|---|---|---|---|---|---|---|---|---|",
        *(f"| {r['setting']} | {r['episodes']} | {_body(r)} "
          f"| {r['client_tps']:.0f} "
          f"| {r['gateway_tps']:.0f} | {r['ratio']:.2f} ± {r['ratio_se']:.2f} | {r['client_us']:.0f} "
          f"| {r['gateway_us']:.0f} "
          f"| {r['harness_us']:.0f} |" for r in rows),
        "",
        "Driver CPU: the driver process's CPU time per generated token under load (client, gateway, engine "
        "handle; the engine and the harness process are not in it) — the gateway's own cost, whatever the load. "
        "Harness process CPU: the `openai` SDK's and httpx's side, which on this 2-core machine competes with the "
        "engine and the driver for the same cores (a real cluster runs harnesses elsewhere). Settings: *shared* "
        "cores: every process may use both cores, the engine with 2 threads; *split*: the engine (1 thread) alone "
        "on one core, the driver and the harness process on the other, as on a cluster. *Fixed* lengths: every "
        "response the same length, so episodes move in lockstep and each request's CPU falls between two engine "
        "batches (the worst case); *varied*: lognormal lengths (σ 1, the same sequence on both paths), so that "
        "CPU overlaps decoding as in a rollout.",
        "",
        f"Command: {note}, on this 2-core machine.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="turns each path takes per row")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="seconds of load per path and round whose answers count")
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="seconds of load per path and round before those, not counted")
    parser.add_argument("--episodes", default="1,64,256", help="concurrent episodes, comma-separated")
    parser.add_argument("--settings", default="shared-fixed,shared-varied,split-varied",
                        help="comma-separated CORES-LENGTHS: cores shared (every process on every core) or split "
                        "(the engine on all but the last core, the driver and the harness on the last); lengths "
                        f"fixed (every response --max-tokens long) or varied (lognormal around it, σ {VARIED_SIGMA})")
    parser.add_argument("--stream-intervals", default="1", help="comma-separated rollout.stream_interval values; "
                        "each streamed row is measured at every one (both paths)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    print(f"{'episodes':>8} {'body':>9} {'client':>10} {'gateway':>10} {'ratio':>6} {'client':>9} {'gateway':>9} "
          f"{'harness':>9}")
    print(f"{'':>8} {'':>9} {'tokens/s':>21} {'':>6} {'CPU µs/token (driver, driver, harness)':>29}")
    started = time.perf_counter()
    concurrencies = [int(c) for c in args.episodes.split(",")]
    settings = sorted((Setting.parse(text) for text in args.settings.split(",")), key=lambda s: s.split)
    rows = []
    for setting in settings:  # shared cores first: split_cores pins Ray's processes for good
        print(f"{setting.label}:")
        rows += asyncio.run(measure(args.max_tokens, args.rounds, Window(args.seconds, args.warmup), concurrencies,
                                    setting, [int(i) for i in args.stream_intervals.split(",")]))
    report(render(rows, run_note(started)), BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
