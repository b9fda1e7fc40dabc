"""The harness side of bench/gateway_overhead.py, in a process of its own as real harnesses are.

Reads commands from stdin, one JSON object per line:
- {"urls": [[base_url, api_key], ...], "request": {...}, "stream": bool, "seconds": T, "warmup": W, "sigma": σ}:
  every URL is one episode sending the request with the `openai` SDK again as soon as it is answered, for W + T
  seconds (`_timing.sustained`), each turn's `max_tokens` from `_timing.turn_length`; answers {"tokens",
  "produced"} (the tokens answered in the window of T seconds, every token produced);
- {"close": [base_url, ...]}: closes those episodes' clients; answers {"closed": n}.
An empty line ends it.

Each episode (base URL) gets its own SDK client with its own HTTP connection pool, made on its first request
and kept for its later ones, as an agent keeps its client across turns. One pool shared by hundreds of
episodes would cost every request a scan of all its connections (httpcore checks each for expiry, a
`getpeername` per connection): at 256 episodes that scan was a fifth of this process's CPU, a cost of the
load generator and not of the gateway.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from _timing import completion_tokens, sustained, turn_length  # bench/ is on sys.path when run as a script
from openai import AsyncOpenAI


class Episodes:
    """One SDK client per episode's base URL."""

    def __init__(self) -> None:
        self.clients: dict[str, AsyncOpenAI] = {}

    def sdk(self, url: str, key: str) -> AsyncOpenAI:
        if url not in self.clients:
            self.clients[url] = AsyncOpenAI(base_url=url, api_key=key, max_retries=0,
                                            http_client=httpx.AsyncClient(timeout=600))
        return self.clients[url]

    async def close(self, urls: list[str]) -> int:
        closing = [self.clients.pop(url) for url in urls if url in self.clients]
        await asyncio.gather(*(sdk.close() for sdk in closing))
        return len(closing)


async def main() -> None:
    episodes = Episodes()
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        command = json.loads(line)
        if "close" in command:
            print(json.dumps({"closed": await episodes.close(command["close"])}), flush=True)
            continue
        request, stream, sigma = command["request"], command["stream"], command["sigma"]
        sdks = [episodes.sdk(url, key).chat.completions for url, key in command["urls"]]

        def send(episode: int, turn: int, sdks: list = sdks, request: dict = request, sigma: float = sigma,
                 stream: bool = stream) -> Any:
            length = turn_length(episode, turn, request["max_tokens"], sigma)
            return completion_tokens(sdks[episode], {**request, "max_tokens": length}, stream)

        tokens, produced = await sustained(send, len(sdks), command["seconds"], command["warmup"])
        print(json.dumps({"tokens": tokens, "produced": produced}), flush=True)
    await episodes.close(list(episodes.clients))


if __name__ == "__main__":
    asyncio.run(main())
