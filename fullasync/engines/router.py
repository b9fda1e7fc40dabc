"""Routes requests over several engines: sticky per episode, by the KV cache the episodes hold.

Owns: the choice of engine for a request, the in-flight counts, and the KV budget of the episodes bound to each
engine. Does not own: the engines themselves. Stickiness keeps an episode's turns on one engine so its prefix cache
is reused; `release(episode_id)` forgets the binding when the episode ends. An agent episode holds its context in
its engine's cache between calls (while its tool runs), so an engine's load is what its bound episodes hold, not
only what it is generating: each bound episode counts its context — while a call runs, its prompt and what it will
likely generate (its budget, or the typical answer where that is shorter); once the call is done (`settle`), its
prompt and answer, which is what the cache holds while the episode's tool runs — and never less than the typical
episode's (the mean context over an ended episode's calls, averaged over the episodes that ended: an episode
admitted at its short first prompt grows). A new episode binds to the engine with the most room (engines whose
capacity is unknown: the fewest bound episodes, then the least in flight). With known capacities (an engine's
`kv_tokens`), `admit` holds a new episode's first call until some engine has room for it — admission by KV
budget: past what the caches hold, more episodes at once only evict each other's contexts (each call prefills its
whole context again) — unless that engine holds no episode at all (one larger than a cache still runs, alone) or
some engine has nothing in flight: holding the call would leave that engine idle while its episodes' tools run (the
admission is work-conserving). A bound episode's calls stay on its engine while the engine has room for its grown
context; past that it moves, once (counted in `moves`), to the engine with the most room if its whole context fits
there — one prefill there rather than evicting its neighbours' contexts here, call after call. An engine declared
dead (`engine.death`) is never picked again: its episodes move to a live engine (counted in `moves`), and when none
is left `pick` raises the death of the first engine. `kv_aware=False` (`rollout.kv_routing=false`): the engine with
the fewest requests in flight, never waiting.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence

from fullasync.contracts.engine import Engine, GenerateRequest, GenerateResult, KVStats, TokenDelta
from fullasync.errors import again
from fullasync.infra.offload import first_of

TYPICAL_WEIGHT = 0.05  # an ended episode's (a done call's) weight in the typical context (answer)


def kv_capacity(engine: Engine) -> int | None:
    """The engine's KV-cache capacity in tokens, where it knows one (`Engine.kv_tokens`; an engine that does not is
    routed by its bound episodes' count)."""
    return engine.kv_tokens


ENGINE_STATS_TIMEOUT_S = 5.0  # an engine that does not answer its counters in time is left out of a step's metrics


async def engine_kv_metrics(engines: Sequence[Engine]) -> dict[str, float]:
    """The engines' own KV counters for the step metrics (engines that keep them, live and answering): per
    engine its prefix-cache hit rate (hit over queried prompt tokens, over its life) and KV usage; summed, the
    prompt tokens prefilled because no cache held them."""
    async def ask(engine: Engine) -> KVStats | None:
        if engine.death is not None:
            return None
        try:
            return await asyncio.wait_for(engine.kv_stats(), ENGINE_STATS_TIMEOUT_S)
        except Exception:  # a dead or busy engine: its watchdog reports it, the metrics leave it out
            return None

    answers = await asyncio.gather(*(ask(engine) for engine in engines))
    metrics: dict[str, float] = {}
    recomputed = 0
    for engine, stats in zip(engines, answers, strict=True):
        if stats is None:
            continue
        recomputed += stats.recomputed
        metrics[f"kv/usage/{engine.name}"] = stats.usage
        if stats.prefix_queries:
            metrics[f"kv/prefix_hit_rate/{engine.name}"] = stats.prefix_hits / stats.prefix_queries
    if metrics:
        metrics["kv/recomputed_prefill_tokens"] = float(recomputed)
    return metrics


class EngineRouter:
    """Sends each request to the bound engine of its episode, or binds one (see the module).

    Binding by KV looks at every live engine, once per episode. The least-loaded engine (`kv_aware=False`) is
    found in O(1) whatever the number of engines: engines sit in buckets by in-flight count
    (a count moves by one per request start or end), with the lowest non-empty bucket tracked; ties go to the
    engine that reached the count first. Dead engines stay in their buckets (a restarted engine serves again) and
    are passed over.
    """

    def __init__(self, engines: Sequence[Engine], kv_aware: bool = True) -> None:
        """`kv_aware=False`: bind a new episode to the engine with the fewest requests in flight, never wait."""
        if not engines:
            raise ValueError("EngineRouter needs at least one engine")
        self.engines = list(engines)
        self.kv_aware = kv_aware
        self._load = {e.name: 0 for e in self.engines}
        self._by_episode: dict[str, Engine] = {}
        self._buckets: dict[int, dict[str, Engine]] = {0: {e.name: e for e in self.engines}}
        self._least = 0  # the lowest in-flight count (its bucket is never empty)
        self._context: dict[str, int] = {}  # episode -> the KV it counts: its latest call's, or the typical one
        self._calls: dict[str, tuple[int, int]] = {}  # episode -> (its done calls' KV summed, its done calls)
        self.typical_context = 0.0  # mean KV over an episode's calls, averaged (EMA) over the ended episodes
        self.typical_answer = 0.0  # tokens generated per call, averaged (EMA) over the done calls
        self._held = {e.name: 0 for e in self.engines}  # engine -> the contexts of the episodes bound to it
        self._bound = {e.name: 0 for e in self.engines}  # engine -> episodes bound to it
        self._room = asyncio.Event()  # set (and replaced) whenever an episode's KV is released
        self.kv_waits = 0  # first calls held for want of KV room
        self.waiting_for_kv = 0  # first calls held now
        self.moves = 0  # episodes moved off a dead engine or off a full one
        self._moved_for_room: set[str] = set()  # episodes moved off a full engine (once each)

    def bound(self, episode_id: str) -> bool:
        """Whether the episode is bound to a live engine (its calls never wait for room)."""
        engine = self._by_episode.get(episode_id)
        return engine is not None and engine.death is None

    def pick(self, episode_id: str) -> Engine:
        """The episode's engine; an unbound episode binds to the engine with the most room (never waits)."""
        engine = self._by_episode.get(episode_id)
        if engine is None or engine.death is not None:
            engine = self._bind(episode_id, self._roomiest(), moved=engine is not None)
        return engine

    async def admit(self, episode_id: str, prompt_tokens: int, max_tokens: int = 0) -> Engine:
        """Account a call of `prompt_tokens` that may generate `max_tokens` to its episode, binding a new episode
        to the engine with the most room; a new episode's first call waits while no engine has room (see the
        module)."""
        answer = min(max_tokens, math.ceil(self.typical_answer)) if self.typical_answer else max_tokens
        tokens = prompt_tokens + answer
        engine = self._by_episode.get(episode_id)
        if engine is not None and engine.death is None:
            engine = self._stay_or_move(episode_id, engine, tokens)
            self._account(episode_id, engine, tokens)
            return engine
        moved = engine is not None
        counted = False
        try:
            while True:
                candidate = self._roomiest()
                capacity = kv_capacity(candidate) if self.kv_aware else None
                if (moved or capacity is None or self._bound[candidate.name] == 0
                        or self._held[candidate.name] + self._counted(tokens) <= capacity):
                    break
                idle = self._idle()
                if idle is not None:
                    candidate = idle
                    break
                if not counted:
                    counted = True
                    self.kv_waits += 1
                    self.waiting_for_kv += 1
                await self._room.wait()
        finally:
            if counted:
                self.waiting_for_kv -= 1
        engine = self._bind(episode_id, candidate, moved)
        self._account(episode_id, engine, tokens)
        return engine

    def _stay_or_move(self, episode_id: str, engine: Engine, tokens: int) -> Engine:
        """A bound episode's engine for its next call: its own while it has room for the grown context; else,
        once per episode, the engine with the most room where the whole context fits."""
        capacity = kv_capacity(engine) if self.kv_aware else None
        counted = self._counted(tokens)
        if (capacity is None or episode_id in self._moved_for_room
                or self._held[engine.name] - self._context.get(episode_id, 0) + counted <= capacity):
            return engine
        other = self._roomiest()
        room = kv_capacity(other)
        if other is engine or room is None or room - self._held[other.name] < counted:
            return engine
        self._moved_for_room.add(episode_id)
        return self._bind(episode_id, other, moved=True)

    def _bind(self, episode_id: str, engine: Engine, moved: bool) -> Engine:
        self._unbind(episode_id)
        self._by_episode[episode_id] = engine
        self._bound[engine.name] += 1
        self.moves += moved
        return engine

    def settle(self, episode_id: str, prompt_tokens: int, answer_tokens: int) -> None:
        """A call of the episode is done: its context is now its prompt and answer (what the cache holds while
        its tool runs), counted in place of the call's estimate."""
        tokens = prompt_tokens + answer_tokens
        self.typical_answer = answer_tokens if not self.typical_answer else (
            TYPICAL_WEIGHT * answer_tokens + (1 - TYPICAL_WEIGHT) * self.typical_answer)
        engine = self._by_episode.get(episode_id)
        if engine is None:  # released already (a call that ended after its episode): nothing to count
            return
        total, calls = self._calls.get(episode_id, (0, 0))
        self._calls[episode_id] = (total + tokens, calls + 1)
        self._account(episode_id, engine, tokens)

    def _account(self, episode_id: str, engine: Engine, tokens: int) -> None:
        counted = self._counted(tokens)
        self._held[engine.name] += counted - self._context.get(episode_id, 0)
        self._context[episode_id] = counted

    def _counted(self, tokens: int) -> int:
        return max(tokens, round(self.typical_context))

    def _unbind(self, episode_id: str) -> None:
        engine = self._by_episode.pop(episode_id, None)
        if engine is None:
            return
        self._bound[engine.name] -= 1
        self._held[engine.name] -= self._context.pop(episode_id, 0)
        self._wake()

    def _wake(self) -> None:
        """Wake the held first calls: they look again."""
        self._room.set()
        self._room = asyncio.Event()

    def _idle(self) -> Engine | None:
        """A live engine with nothing in flight (the one with the most room among them), if any."""
        idle = [e for e in self._buckets.get(0, {}).values() if e.death is None]
        return max(idle, key=lambda e: (kv_capacity(e) or 0) - self._held[e.name]) if idle else None

    def _roomiest(self) -> Engine:
        """The live engine with the most KV room (capacity less what its episodes hold); where capacities are
        unknown, the one with the fewest bound episodes; ties to the least loaded, then the first."""
        live = [e for e in self.engines if e.death is None]
        if not live or not self.kv_aware:
            return self._least_loaded()  # with none live: raises the death
        return max(live, key=lambda e: (
            (capacity - self._held[e.name]) if (capacity := kv_capacity(e)) is not None else -self._bound[e.name],
            -self._load[e.name]))

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
        if load + by == 0 and self.waiting_for_kv:
            self._wake()  # an idle engine takes a held first call

    def dead_engines(self) -> list[Engine]:
        return [e for e in self.engines if e.death is not None]

    async def wait_alive(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until some engine serves again, e.g. after a restart: woken by the restart
        itself (`Engine.wait_serving`), not by a poll."""
        if len(self.dead_engines()) < len(self.engines):
            return True
        return await first_of((engine.wait_serving() for engine in self.engines), timeout_s)

    def release(self, episode_id: str) -> None:
        """The episode ended: its binding and the KV it counted go (a first call held for room looks again)."""
        total, calls = self._calls.pop(episode_id, (0, 0))
        self._moved_for_room.discard(episode_id)
        if calls:
            mean = total / calls
            self.typical_context = mean if not self.typical_context else (
                TYPICAL_WEIGHT * mean + (1 - TYPICAL_WEIGHT) * self.typical_context)
        self._unbind(episode_id)

    def stats(self) -> dict[str, float]:
        """For the step metrics: first calls held for KV room (so far, and now), episodes moved (off a dead or full
        engine),
        the typical episode context, and per engine the KV its bound episodes count (with its share of the
        engine's capacity where the engine reports one)."""
        metrics = {"kv/waits": float(self.kv_waits), "kv/episodes_waiting": float(self.waiting_for_kv),
                   "kv/moves": float(self.moves), "kv/typical_context": float(self.typical_context)}
        for engine in self.engines:
            metrics[f"kv/held_tokens/{engine.name}"] = float(self._held[engine.name])
            if (capacity := kv_capacity(engine)) is not None:
                metrics[f"kv/held_frac/{engine.name}"] = self._held[engine.name] / capacity
        return metrics

    async def kv_metrics(self) -> dict[str, float]:
        """`stats()` and the engines' own KV counters (`engine_kv_metrics`): what each step's metrics take."""
        return {**self.stats(), **await engine_kv_metrics(self.engines)}

    def held(self, engine_name: str) -> int:
        """The KV (tokens) the episodes bound to that engine count."""
        return self._held[engine_name]

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
