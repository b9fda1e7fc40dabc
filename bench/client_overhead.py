"""Throughput of `RolloutClient` vs direct engine `generate`, in one run (tokens/s and ratio).

Same engine, same prompt ids, same number of generated tokens (EOS ignored); concurrency 1 and 32.
Three paths: the engine handle directly, `client.completions.create` with token ids, and
`client.chat.completions.create` (chat template, tool-less). Prints a table; asserts nothing.

    .venv/bin/python bench/client_overhead.py [--max-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _timing import MESSAGES, interleaved, tiny_engine_service

from fullasync.contracts.engine import GenerateRequest, SamplingOptions


async def main(max_tokens: int, rounds: int) -> None:
    engine, service = await tiny_engine_service()
    prompt_ids = service.chat_tokens.prompt_ids(MESSAGES, None)
    sampling = SamplingOptions(ignore_eos=True)

    async def direct(i: int) -> int:
        request = GenerateRequest(f"direct-{time.monotonic_ns()}-{i}", tuple(prompt_ids), max_tokens, sampling)
        result = await engine.generate(request)
        return len(result.output_ids)

    async def completions(i: int) -> int:
        response = await service.client().completions.create(
            model="policy", prompt=prompt_ids, max_tokens=max_tokens, extra_body={"ignore_eos": True}
        )
        return response.usage.completion_tokens

    async def chat(i: int) -> int:
        response = await service.client().chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=max_tokens, extra_body={"ignore_eos": True}
        )
        return response.usage.completion_tokens

    paths = {"engine": direct, "completions": completions, "chat": chat}
    for concurrency in (1, 32):  # warm-up: the first batches of each shape are slow
        await interleaved(paths, concurrency, 1)
    print(f"max_tokens={max_tokens} rounds={rounds}")
    print(f"{'concurrency':>11} {'engine tok/s':>13} {'completions':>12} {'ratio':>6} {'chat':>9} {'ratio':>6}")
    for concurrency in (1, 32):
        rates = {name: tokens for name, (_, tokens) in (await interleaved(paths, concurrency, rounds)).items()}
        base = rates["engine"]
        print(f"{concurrency:>11} {base:>13.0f} {rates['completions']:>12.0f} {rates['completions'] / base:>6.2f} "
              f"{rates['chat']:>9.0f} {rates['chat'] / base:>6.2f}")
    await engine.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.max_tokens, args.rounds))
