"""Tokens/s through the HTTP gateway vs the in-process client, in one run (ratios).

Same engine (vLLM, the tiny model), same chat request (EOS ignored, fixed length), non-streaming and
streaming, at 1, 64 and 256 concurrent episodes. The in-process path is a `rollout_fn`'s: the client in
the driver's event loop. The gateway path is a harness's: the `openai` SDK in a process of its own
(bench/_gateway_load.py), one base URL per episode, over loopback HTTP to the gateway in the driver's
loop — so the SDK's own parsing is not counted against the gateway, as with a real harness. The two
paths take turns wave by wave so drift hits both alike. Asserts nothing; writes its section of
docs/benchmarks.md unless --no-write.

    .venv/bin/python bench/gateway_overhead.py [--max-tokens 32] [--rounds 3] [--episodes 1,64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from _timing import MESSAGES, completion_tokens, tiny_engine_service
from scheduling import write_section

from fullasync.gateway import Gateway

BENCH = Path(__file__).resolve().parent
DOCS = BENCH.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- gateway-overhead:begin -->", "<!-- gateway-overhead:end -->"


class HarnessProcess:
    """The SDK side, in its own interpreter: one wave of requests per `wave()` call."""

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

    async def wave(self, urls: list[tuple[str, str]], request: dict, stream: bool) -> tuple[int, float, float]:
        harness_cpu = self.cpu_s()
        self.process.stdin.write((json.dumps({"urls": urls, "request": request, "stream": stream}) + "\n").encode())
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError("the harness process ended early; run bench/_gateway_load.py alone to see why")
        answer = json.loads(line)
        return answer["tokens"], answer["seconds"], self.cpu_s() - harness_cpu

    async def stop(self) -> None:
        self.process.stdin.write(b"\n")
        await self.process.stdin.drain()
        await self.process.wait()


async def in_process_wave(service, request: dict, stream: bool, concurrency: int) -> tuple[int, float, float]:
    async def one() -> int:
        return await completion_tokens(service.client().chat.completions, request, stream)

    start, cpu = time.perf_counter(), time.process_time()
    tokens = sum(await asyncio.gather(*(one() for _ in range(concurrency))))
    return tokens, time.perf_counter() - start, time.process_time() - cpu


async def gateway_wave(gateway: Gateway, harness: HarnessProcess, request: dict, stream: bool,
                       concurrency: int) -> tuple[int, float, float, float]:
    cpu = time.process_time()
    episodes = [gateway.open_episode() for _ in range(concurrency)]
    try:
        tokens, seconds, harness_cpu = await harness.wave([(e.base_url, e.api_key) for e in episodes], request,
                                                           stream)
        return tokens, seconds, time.process_time() - cpu, harness_cpu
    finally:
        for episode in episodes:
            gateway.close_episode(episode)


async def measure(max_tokens: int, rounds: int, concurrencies: list[int]) -> list[dict]:
    engine, service = await tiny_engine_service()
    gateway = Gateway(service)
    await gateway.start()
    harness = await HarnessProcess.start()
    request = dict(model="policy", messages=MESSAGES, max_tokens=max_tokens, extra_body={"ignore_eos": True})
    rows = []
    try:
        for stream in (False, True):  # warm-up: compile paths, open connections
            await in_process_wave(service, request, stream, 4)
            await gateway_wave(gateway, harness, request, stream, 4)
        for concurrency in concurrencies:
            for stream in (False, True):
                totals = {"client": [0, 0.0, 0.0, 0.0], "gateway": [0, 0.0, 0.0, 0.0]}
                for _ in range(rounds):
                    for name, result in (("client", await in_process_wave(service, request, stream, concurrency)),
                                         ("gateway", await gateway_wave(gateway, harness, request, stream,
                                                                        concurrency))):
                        for i, value in enumerate(result):
                            totals[name][i] += value
                client_tps = totals["client"][0] / totals["client"][1]
                gateway_tps = totals["gateway"][0] / totals["gateway"][1]
                row = {"episodes": concurrency, "stream": stream, "client_tps": client_tps,
                       "gateway_tps": gateway_tps, "ratio": gateway_tps / client_tps,
                       "client_us": 1e6 * totals["client"][2] / totals["client"][0],
                       "gateway_us": 1e6 * totals["gateway"][2] / totals["gateway"][0],
                       "harness_us": 1e6 * totals["gateway"][3] / totals["gateway"][0]}
                rows.append(row)
                print(f"{concurrency:>8} {'stream' if stream else 'json':>7} {client_tps:>10.0f} {gateway_tps:>10.0f} "
                      f"{row['ratio']:>6.2f} {row['client_us']:>9.0f} {row['gateway_us']:>9.0f} {row['harness_us']:>9.0f}",
                      flush=True)
    finally:
        await harness.stop()
        await gateway.stop()
        await engine.shutdown()
    return rows


def render(rows: list[dict], command: str, elapsed_s: float, load: tuple[float, ...]) -> str:
    lines = [
        "## Gateway overhead",
        "",
        "Tokens/s of the same chat requests through the gateway (the `openai` SDK in a separate process, one base "
        "URL per episode, loopback HTTP) and through the in-process client (a `rollout_fn`), on one vLLM engine "
        "with the tiny model; the paths take turns wave by wave. Goal: ratio ≥ 0.97 at 1 episode, ≥ 0.9 at 64.",
        "",
        "| episodes | response | in-process tok/s | gateway tok/s | gateway ÷ in-process | driver CPU µs/token "
        "in-process | through the gateway | harness process CPU µs/token |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {r['episodes']} | {'SSE stream' if r['stream'] else 'JSON'} | {r['client_tps']:.0f} "
          f"| {r['gateway_tps']:.0f} | {r['ratio']:.2f} | {r['client_us']:.0f} | {r['gateway_us']:.0f} "
          f"| {r['harness_us']:.0f} |" for r in rows),
        "",
        "Driver CPU: the driver process's CPU time per generated token over the waves (client, gateway, engine "
        "handle; the engine and the harness process are not in it) — the gateway's own cost, whatever the load. "
        "Harness process CPU: the `openai` SDK's and httpx's side, which on this 2-core machine competes with the "
        "engine and the driver for the same cores (a real cluster runs harnesses elsewhere).",
        "",
        f"Command: `{command}` — {elapsed_s:.0f} s; load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        "(1 / 5 / 15 min) at the end, on this 2-core machine.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", default="1,64,256", help="concurrent episodes, comma-separated")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    print(f"{'episodes':>8} {'body':>7} {'client':>10} {'gateway':>10} {'ratio':>6} {'client':>9} {'gateway':>9} "
          f"{'harness':>9}")
    print(f"{'':>8} {'':>7} {'tokens/s':>21} {'':>6} {'CPU µs/token (driver, driver, harness)':>29}")
    started = time.perf_counter()
    rows = asyncio.run(measure(args.max_tokens, args.rounds, [int(c) for c in args.episodes.split(",")]))
    if not args.no_write:
        command = "python bench/gateway_overhead.py " + " ".join(sys.argv[1:])
        write_section(DOCS, render(rows, command.strip(), time.perf_counter() - started, os.getloadavg()), BEGIN, END)


if __name__ == "__main__":
    main()
