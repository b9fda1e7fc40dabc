"""Start engines: `launch_vllm_engines` spawns the actors on the nodes that offer their `ray_resources`, waits
until every one serves (with progress), and starts their watchdogs."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

from fullasync.engines.vllm.actor import spawn_actor
from fullasync.engines.vllm.config import VLLMEngineConfig
from fullasync.engines.vllm.handle import RayEngine
from fullasync.infra.placement import require_cluster_offers
from fullasync.observe.logs import progress

log = logging.getLogger("fullasync")


async def launch_vllm_engines(config: VLLMEngineConfig, num_engines: int = 1,
                              initial_version: int = 0) -> list[RayEngine]:
    """Start `num_engines` engine actors in the running Ray cluster, wait until all serve, watch them."""
    if num_engines < 1:
        raise ValueError(f"num_engines must be >= 1, got {num_engines}")
    if not os.path.isdir(config.model_path):
        raise FileNotFoundError(f"model_path {config.model_path!r} is not a directory with a HF model")
    require_cluster_offers("engine.ray_resources", config.ray_resources)
    engines = []
    for index in range(num_engines):
        name = f"engine-{index}-{uuid.uuid4().hex[:6]}"
        engines.append(RayEngine(spawn_actor(config, name, name), name, config))
    began = time.perf_counter()

    async def start(engine: RayEngine) -> None:
        await engine._call("start", initial_version, timeout_s=config.start_timeout_s)
        await engine.read_kv_capacity()
        ready.append(engine.name)
        log.info("engine %d/%d ready: %s (%.1f s)", len(ready), num_engines, engine.name, time.perf_counter() - began,
                 extra=progress("engines", len(ready), num_engines))

    ready: list[str] = []
    await asyncio.gather(*(start(e) for e in engines))
    settings = await engines[0]._call("vllm_settings")
    log.info("engines hold vLLM's %s", ", ".join(f"{name}={value}" for name, value in settings.items()))
    for engine in engines:
        engine.watch()
    return engines
