"""Shared timing helpers of the benchmarks: waves of concurrent calls, paths taking turns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

MESSAGES = [{"role": "user", "content": "Write the numbers from one to fifty in words."}]

Call = Callable[[int], Awaitable[int]]  # one request; returns the tokens it produced


async def wave(make_one: Call, concurrency: int) -> tuple[int, int, float]:
    """Requests, tokens and seconds of one wave of `concurrency` concurrent requests."""
    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(make_one(i) for i in range(concurrency))))
    return concurrency, tokens, time.perf_counter() - start


async def interleaved(paths: Mapping[str, Call], concurrency: int, rounds: int) -> dict[str, tuple[float, float]]:
    """(requests/s, tokens/s) per path; the paths take turns wave by wave so drift hits all alike."""
    totals = {name: [0, 0, 0.0] for name in paths}
    for _ in range(rounds):
        for name, make_one in paths.items():
            requests, tokens, seconds = await wave(make_one, concurrency)
            totals[name][0] += requests
            totals[name][1] += tokens
            totals[name][2] += seconds
    return {name: (r / s, t / s) for name, (r, t, s) in totals.items()}


async def tiny_engine_service():
    """One vLLM engine on the tiny local model, and the client service in front of it."""
    from fullasync.client import RolloutService
    from fullasync.engines.vllm_engine import VLLMEngineConfig, launch_vllm_engines
    from fullasync.models import build_tiny_model, load_tokenizer
    from fullasync.runtime import init_ray

    model_path = str(build_tiny_model())
    init_ray()
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=model_path))
    return engine, RolloutService([engine], load_tokenizer(model_path))
