"""What one streamed chunk costs on each side of the gateway, as written now (the fields the chunk set, as vLLM
writes them) against every field with its null (the gateway's wire before), in one run.

Driver side: serialising one chunk (`model_dump_json`). Harness side: the `openai` SDK reading a streamed
answer of `--events` content chunks through its own SSE decoder and chunk types, from an in-memory HTTP transport
(no sockets: the SDK's parsing alone); per event = (answer of N events − answer of 1 event) / (N − 1). Best of
`--repeats` alternating runs. Asserts nothing; prints the table (docs/benchmarks/gateway-overhead.md quotes it by hand).

    .venv/bin/python bench/stream_chunks.py [--events 21] [--requests 400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import timeit

import httpx
from openai import AsyncOpenAI
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from fullasync.client.streaming import _chunk
from fullasync.gateway.dialects import _chunk_json
from fullasync.gateway.routes import _json
from fullasync.gateway.wire import sse

WIRES = {"set fields (now)": _chunk_json, "every field, nulls (before)": _json}


async def sdk_seconds(event: bytes, events: int, requests: int) -> float:
    body = event * events + sse("[DONE]")
    transport = httpx.MockTransport(lambda request: httpx.Response(
        200, content=body, headers={"content-type": "text/event-stream"}))
    sdk = AsyncOpenAI(base_url="http://gateway/v1", api_key="k", max_retries=0,
                      http_client=httpx.AsyncClient(transport=transport))
    start = time.perf_counter()
    for _ in range(requests):
        stream = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                   stream=True)
        async for _chunk_read in stream:
            continue
    elapsed = time.perf_counter() - start
    await sdk.close()
    return elapsed / requests


async def main(args: argparse.Namespace) -> None:
    chunk = _chunk("chatcmpl-0123456789abcdef", 1764300000, "policy", ChoiceDelta(content=" eight tokens of text, say"))
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.repeats):
        for name, wire in WIRES.items():
            event = sse(wire(chunk))
            for events in (1, args.events):
                seconds = await sdk_seconds(event, events, args.requests)
                best[name, events] = min(best.get((name, events), float("inf")), seconds)
    print(f"| wire | event bytes | driver µs per chunk | SDK µs per event | SDK µs per answer of {args.events} |")
    print("|---|---|---|---|---|")
    per_event = {}
    for name, wire in WIRES.items():
        dump = min(timeit.repeat(lambda wire=wire: wire(chunk), number=2000, repeat=args.repeats)) / 2000
        per_event[name] = (best[name, args.events] - best[name, 1]) / (args.events - 1)
        print(f"| {name} | {len(sse(wire(chunk)))} | {dump * 1e6:.1f} | {per_event[name] * 1e6:.1f} | "
              f"{best[name, args.events] * 1e6:.0f} |")
    now, before = per_event.values()
    print(f"SDK per event, now ÷ before: {now / before:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=21)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
