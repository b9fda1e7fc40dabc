"""The harness side of bench/gateway_overhead.py, in a process of its own as real harnesses are.

Reads commands from stdin, one JSON object per line: {"urls": [[base_url, api_key], ...], "request": {...},
"stream": bool}. For each, sends one request per URL at once with the `openai` SDK and answers with one JSON
line {"requests", "tokens", "seconds"}. An empty line ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx
from _timing import completion_tokens  # bench/ is on sys.path when run as a script
from openai import AsyncOpenAI


async def one(http: httpx.AsyncClient, url: str, key: str, request: dict, stream: bool) -> int:
    sdk = AsyncOpenAI(base_url=url, api_key=key, http_client=http, max_retries=0)
    return await completion_tokens(sdk.chat.completions, request, stream)


async def main() -> None:
    http = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1024, max_keepalive_connections=1024))
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        command = json.loads(line)
        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(http, url, key, command["request"], command["stream"])
                                        for url, key in command["urls"]))
        print(json.dumps({"requests": len(tokens), "tokens": sum(tokens), "seconds": time.perf_counter() - start}),
              flush=True)
    await http.aclose()


if __name__ == "__main__":
    asyncio.run(main())
