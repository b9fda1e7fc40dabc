"""The engine's own KV counters, read from vLLM's stat loggers: prompt tokens looked up in the prefix cache and
found there, and the share of KV blocks in use.

Owns: `KVStatLogger`, a vLLM stat logger (`StatLoggerBase`; vLLM calls `record` with each scheduler step's stats)
that accumulates them in the engine actor. Imports vLLM: loaded by the actor's `start` only.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from fullasync.contracts.engine import KVStats


class KVStatLogger(StatLoggerBase):
    """Cumulative prefix-cache queries and hits (tokens) and the last KV usage, over the engine's life."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self.vllm_config = vllm_config
        self.queries = 0
        self.hits = 0
        self.usage = 0.0

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
               mm_cache_stats: object = None, engine_idx: int = 0) -> None:
        if scheduler_stats is None:
            return
        self.queries += scheduler_stats.prefix_cache_stats.queries
        self.hits += scheduler_stats.prefix_cache_stats.hits
        self.usage = scheduler_stats.kv_cache_usage

    def log_engine_initialized(self) -> None:
        pass

    def stats(self) -> KVStats:
        cache = self.vllm_config.cache_config
        capacity = (cache.num_gpu_blocks or 0) * cache.block_size
        return KVStats(prefix_queries=self.queries, prefix_hits=self.hits, usage=self.usage,
                       capacity_tokens=capacity)
