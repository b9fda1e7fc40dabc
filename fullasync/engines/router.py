"""Routes requests over several engines: least-loaded, sticky per episode.

Owns: the choice of engine for a request and the in-flight count it is based on.
Does not own: the engines themselves. Stickiness keeps an episode's turns on one engine so its
prefix cache is reused; `release(episode_id)` forgets the binding when the episode ends. An engine
declared dead (`engine.death`) is never picked again: its episodes move to a live engine, and when
none is left `pick` raises the death of the first engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from fullasync.contracts.engine import Engine, GenerateRequest, GenerateResult, TokenDelta
from fullasync.errors import again


class EngineRouter:
    """Sends each request to the bound engine of its episode, or binds the least-loaded one.

    The least-loaded engine is found in O(1) whatever the number of engines: engines sit in
    buckets by in-flight count (a count moves by one per request start or end), with the lowest
    non-empty bucket tracked; ties go to the engine that reached the count first. Dead engines stay
    in their buckets (a restarted engine serves again) and are passed over.
    """

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("EngineRouter needs at least one engine")
        self.engines = list(engines)
        self._load = {e.name: 0 for e in self.engines}
        self._by_episode: dict[str, Engine] = {}
        self._buckets: dict[int, dict[str, Engine]] = {0: {e.name: e for e in self.engines}}
        self._least = 0  # the lowest in-flight count (its bucket is never empty)

    def pick(self, episode_id: str) -> Engine:
        engine = self._by_episode.get(episode_id)
        if engine is None or engine.death is not None:
            engine = self._least_loaded()
            self._by_episode[episode_id] = engine
        return engine

    def _least_loaded(self) -> Engine:
        for engine in self._buckets[self._least].values():
            if engine.death is None:
                return engine
        for load in sorted(self._buckets):  # dead engines at the lowest counts: look further up
            for engine in self._buckets[load].values():
                if engine.death is None:
                    return engine
        death = self.engines[0].death
        raise again(death) if death else RuntimeError("EngineRouter: no live engine, yet none is declared dead")

    def _move(self, engine: Engine, by: int) -> None:
        load = self._load[engine.name]
        self._load[engine.name] = load + by
        bucket = self._buckets[load]
        del bucket[engine.name]
        self._buckets.setdefault(load + by, {})[engine.name] = engine
        if not bucket:
            del self._buckets[load]
            if load == self._least:
                self._least = load + by
        if load + by < self._least:
            self._least = load + by

    def dead_engines(self) -> list[Engine]:
        return [e for e in self.engines if e.death is not None]

    async def wait_alive(self, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Wait (at most `timeout_s`) until some engine serves again, e.g. after a restart."""
        waited = 0.0
        while len(self.dead_engines()) == len(self.engines):
            if waited >= timeout_s:
                return False
            await asyncio.sleep(poll_s)
            waited += poll_s
        return True

    def release(self, episode_id: str) -> None:
        self._by_episode.pop(episode_id, None)

    def load(self, engine_name: str) -> int:
        return self._load[engine_name]

    async def generate_stream(self, request: GenerateRequest,
                              episode_id: str) -> AsyncIterator[TokenDelta | GenerateResult]:
        engine = self.pick(episode_id)
        self._move(engine, +1)
        try:
            async for item in engine.generate_stream(request):
                yield item
        finally:
            self._move(engine, -1)

    async def generate(self, request: GenerateRequest, episode_id: str) -> GenerateResult:
        engine = self.pick(episode_id)
        self._move(engine, +1)
        try:
            return await engine.generate(request)
        finally:
            self._move(engine, -1)
