"""Requests/s and tokens/s through the HTTP gateway vs the in-process client, in one run (ratio).

Same engine, same chat request (EOS ignored, fixed length); 1 and 64 concurrent episodes, each
with its own base URL and `openai.AsyncOpenAI`; the two paths take turns wave by wave. Asserts nothing.

    .venv/bin/python bench/gateway_overhead.py [--max-tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio

import httpx
from _timing import MESSAGES, interleaved, tiny_engine_service
from openai import AsyncOpenAI

from fullasync.gateway import Gateway

async def main(max_tokens: int, rounds: int) -> None:
    engine, service = await tiny_engine_service()
    gateway = Gateway(service)
    await gateway.start()
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=256, max_keepalive_connections=256))
    request = dict(model="policy", messages=MESSAGES, max_tokens=max_tokens, extra_body={"ignore_eos": True})

    async def in_process(i: int) -> int:
        return (await service.client().chat.completions.create(**request)).usage.completion_tokens

    async def through_gateway(i: int) -> int:
        episode = gateway.open_episode()
        sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, http_client=http)
        response = await sdk.chat.completions.create(**request)
        gateway.close_episode(episode)
        return response.usage.completion_tokens

    paths = {"client": in_process, "gateway": through_gateway}
    for concurrency in (1, 64):
        await interleaved(paths, concurrency, 1)  # warm-up
    print(f"max_tokens={max_tokens} rounds={rounds}")
    print(f"{'episodes':>8} {'client req/s':>13} {'tok/s':>8} {'gateway req/s':>14} {'tok/s':>8} {'ratio':>6}")
    for concurrency in (1, 64):
        rates = await interleaved(paths, concurrency, rounds)
        (client_rps, client_tps), (gateway_rps, gateway_tps) = rates["client"], rates["gateway"]
        print(f"{concurrency:>8} {client_rps:>13.1f} {client_tps:>8.0f} {gateway_rps:>14.1f} {gateway_tps:>8.0f} "
              f"{gateway_tps / client_tps:>6.2f}")
    await http.aclose()
    await gateway.stop()
    await engine.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.max_tokens, args.rounds))
