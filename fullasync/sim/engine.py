"""`SimulatedEngine`: one inference device as a continuous-batching cost model behind the `Engine` protocol.

Owns: the timing of generation on one device and the protocol semantics the control code relies
on — pause with ABORT returns every in-flight request at once with finish reason `abort`, the
tokens so far and their versions; KEEP freezes them (tokens after the push carry the new
weights' version and, as their oldest version, the one their KV was computed with); RECOMPUTE
freezes them and, at resume, prefills each running one again (prompt + tokens so far) before it
decodes on (tokens after the push carry the new version alone); WAIT lets
running and queued requests finish and admits nothing new; `update_weights` needs a paused engine
and takes `push_s`. Does not own: routing, resubmission after an abort (the
real `RolloutClient` does that), or what the tokens mean (their ids are a constant).

Cost model (all on the event loop's clock, virtual or real):

    decode step with b running sequences   τ(b) = step_base_s + step_per_seq_s · b
    every running sequence gains one token per step (continuous batching, up to max_num_seqs)
    admitting a request costs prefill_per_token_s · len(prompt_ids) of engine time, during which
    no sequence decodes (prefill is not overlapped with decode; resubmitted tokens are prefilled
    again, since a weight push invalidates the KV cache)

With `kv_blocks` (0: unlimited, no prefix cache), the engine has a KV cache of that many blocks with prefix caching
(`kv.PrefixCache`): a request is admitted only when its prompt and generation fit, after evicting the least recently
used free blocks (the first waiting request that does not fit holds the queue, as vLLM's scheduler does), and only
the prompt tokens not found cached are prefilled. A weight push makes every cached block stale.

The engine is event driven: between two events (an arrival, a completion, a pause) the batch is
constant, so it computes the next completion instead of stepping token by token. Per-request
work is O(log b) per event; no Python runs per token.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fullasync.contracts.engine import (
    GenerateRequest,
    GenerateResult,
    InstallTiming,
    KVStats,
    Mortal,
    PauseMode,
    TokenDelta,
    wait_until_set,
)
from fullasync.contracts.weights import WeightsPayload
from fullasync.errors import CONTEXT_LENGTH_EXCEEDED, EngineDiedError, InvalidRequestError
from fullasync.sim.kv import PrefixCache
from fullasync.types import FinishReason

TOKEN_ID = 7  # every simulated output token has this id
TOKEN_LOGPROB = -0.5


@dataclass(frozen=True)
class DecodeCost:
    """Timing of one generation device (seconds)."""

    step_base_s: float = 0.020  # τ(0): the memory-bound part of a decode step (weights read once per step)
    step_per_seq_s: float = 0.0002  # added per running sequence (KV reads, sampling)
    prefill_per_token_s: float = 0.00002  # engine time to prefill one prompt token
    max_num_seqs: int = 32  # concurrent sequences
    push_s: float = 1.0  # time to receive and install one weight version
    kv_blocks: int = 0  # KV-cache capacity in blocks, with prefix caching (0: unlimited, no prefix cache)
    block_size: int = 16  # tokens per KV block

    def step_s(self, batch: int) -> float:
        return self.step_base_s + self.step_per_seq_s * batch

    def seconds_per_token_at_capacity(self) -> float:
        """Engine time per decoded token with a full batch: the cheapest a token can be."""
        return self.step_s(self.max_num_seqs) / self.max_num_seqs


@dataclass
class EngineTime:
    """Where the engine's wall time went; the fields add up to the time since the engine started."""

    decode_s: float = 0.0  # decoding with at least one running sequence
    drain_s: float = 0.0  # decoding while paused with WAIT (only requests admitted before the pause run)
    prefill_s: float = 0.0
    paused_s: float = 0.0  # frozen by a pause with ABORT or KEEP, or idle while paused
    idle_s: float = 0.0  # nothing to run
    tokens: float = 0.0  # tokens decoded (fractional between events)
    drain_tokens: float = 0.0  # of which while draining
    prefill_tokens: int = 0
    aborted_tokens: int = 0  # tokens returned by aborts (to be resubmitted by the client)
    recomputed_tokens: int = 0  # prompt and output tokens prefilled again after a RECOMPUTE push
    cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache (not prefilled; with kv_blocks)

    def total_s(self) -> float:
        return self.decode_s + self.drain_s + self.prefill_s + self.paused_s + self.idle_s


@dataclass
class _Sequence:
    request: GenerateRequest
    future: asyncio.Future[GenerateResult]
    target: int  # tokens to produce
    start_step: float = 0.0  # the engine's step counter when the sequence started decoding
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (version, its KV's, first token index)
    done_at: float = 0.0  # step counter value at which it completes

    def produced(self, steps: float) -> int:
        return min(self.target, int(math.floor(steps - self.start_step + 1e-9)))


def _priority(sequence: _Sequence) -> int:
    return sequence.request.priority


class SimulatedEngine(Mortal):
    """One simulated device serving requests; implements `fullasync.contracts.engine.Engine`."""

    def __init__(self, name: str, cost: DecodeCost, version: int = 0) -> None:
        self.name = name
        self.death: EngineDiedError | None = None  # a simulated engine never dies
        self.workers = 1
        self.cost = cost
        self.time = EngineTime()
        self.kv = PrefixCache(cost.kv_blocks, cost.block_size) if cost.kv_blocks else None
        self._version = version
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}
        self._heap: list[tuple[float, int, str]] = []  # (done_at, tiebreak, request id)
        self._tiebreak = itertools.count()
        self._steps = 0.0  # decode steps taken so far (fractional between events)
        self._prefill_backlog_s = 0.0
        self._pause: PauseMode | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._wake = asyncio.Event()
        self._last = asyncio.get_running_loop().time()
        self.cpu_s = 0.0  # real CPU seconds of this engine's event handling: the simulator's cost, not the driver's
        # tokens decoded per row (finished, aborted or cancelled segments), by the part of the request id before
        # its first "/" (the rollouter's episode ids are "<row id>/<index>"): what a dropped row cost
        self.decoded_by_row: Counter[str] = Counter()
        self._task = asyncio.create_task(self._serve(), name=f"sim-engine-{name}")

    # -- Engine protocol ---------------------------------------------------------------------

    @property
    def kv_tokens(self) -> int | None:
        return self.cost.kv_blocks * self.cost.block_size if self.cost.kv_blocks else None

    async def kv_stats(self) -> KVStats | None:
        """Its prefix cache's counters, as a vLLM engine reports them (None without a KV model)."""
        if self.kv is None:
            return None
        counters = self.kv.counters
        return KVStats(prefix_queries=counters.queried_tokens, prefix_hits=counters.hit_tokens,
                       usage=self.kv.used / self.kv.capacity, capacity_tokens=self.kv.capacity * self.kv.block_size)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        while self._pause is not None:  # a paused engine admits nothing new
            await self._resumed.wait()
        self._advance()
        if self.kv is not None and self.kv.blocks_for(len(request.prompt_ids) + request.max_tokens) > self.kv.capacity:
            raise InvalidRequestError(
                f"engine {self.name}: {len(request.prompt_ids)} prompt + {request.max_tokens} new tokens need more "
                f"than its KV cache's {self.kv.capacity} blocks of {self.kv.block_size}", code=CONTEXT_LENGTH_EXCEEDED)
        future: asyncio.Future[GenerateResult] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Sequence(request, future, target=request.max_tokens))
        self._drained.clear()
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            self._drop(request.request_id)
            raise

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        """The whole output as one delta when the request ends (the cost model has no per-token events), then
        the result."""
        result = await self.generate(request)
        if result.output_ids:
            yield TokenDelta(result.output_ids, result.output_logprobs, result.top_logprobs)
        yield result

    async def abort(self, request_ids: list[str]) -> None:
        self._advance()
        for request_id in request_ids:
            self._finish_aborted(request_id)
        self._wake.set()

    async def pause(self, mode: PauseMode) -> None:
        mode = PauseMode(mode)
        started = time.thread_time()
        self._advance()
        self._pause = mode
        self._resumed.clear()
        if mode is PauseMode.ABORT:
            self._prefill_backlog_s = 0.0  # the prefills of aborted requests are lost
            for request_id in [s.request.request_id for s in self._waiting] + list(self._running):
                self._finish_aborted(request_id)
        self._wake.set()
        self.cpu_s += time.thread_time() - started
        if mode is PauseMode.WAIT:
            await self._drained.wait()

    async def resume(self) -> None:
        self._advance()
        self._pause = None
        self._resumed.set()
        self._wake.set()

    async def wait_resumed(self, timeout_s: float) -> bool:
        return await wait_until_set(self._resumed, timeout_s)

    async def update_weights(self, weights: WeightsPayload, version: int) -> None:
        if self._pause is None:
            raise RuntimeError(f"engine {self.name}: pause the engine before update_weights (see WeightSync)")
        await asyncio.sleep(self.cost.push_s)
        self._advance()
        if self.kv is not None:
            self.kv.invalidate()  # cached blocks hold the old weights' keys and values
        recompute = self._pause is PauseMode.RECOMPUTE
        if recompute:
            self._prefill_backlog_s = 0.0  # every running sequence's KV is computed again, from the start
        for sequence in self._running.values():  # frozen by KEEP or RECOMPUTE: later tokens get the new version
            produced = sequence.produced(self._steps)
            kv_version = version if recompute else sequence.spans[-1][1]
            sequence.spans.append((version, kv_version, produced))
            if recompute:
                tokens = len(sequence.request.prompt_ids) + produced
                self._prefill_backlog_s += tokens * self.cost.prefill_per_token_s
                self.time.prefill_tokens += tokens
                self.time.recomputed_tokens += tokens
        self._version = version

    async def install(self, weights: WeightsPayload, version: int, mode: PauseMode) -> InstallTiming:
        clock = asyncio.get_running_loop().time
        start = clock()
        await self.pause(mode)
        paused = clock()
        await self.update_weights(weights, version)  # a failed update leaves the engine paused (Engine.install)
        updated = clock()
        await self.resume()
        return InstallTiming(paused - start, updated - paused, clock() - updated)

    def mark_dead(self, reason: str, last_request_id: str | None = None) -> None:
        if self.death is None:
            last = f"; the last request it accepted was {last_request_id}" if last_request_id else ""
            self.death = EngineDiedError(f"engine {self.name} is dead: {reason}{last}")

    async def version(self) -> int:
        return self._version

    async def restart(self, weights: WeightsPayload | None, version: int) -> None:
        """A simulated engine never dies; a restart returns what is in flight as aborted and serves `version`."""
        await self.abort([s.request.request_id for s in self._waiting] + list(self._running))
        self._version = version
        self.kv = PrefixCache(self.cost.kv_blocks, self.cost.block_size) if self.cost.kv_blocks else None
        self.death = None

    async def num_in_flight(self) -> int:
        return len(self._running) + len(self._waiting)

    async def in_flight_tokens(self) -> dict[str, int]:
        self._advance()
        produced = {request_id: s.produced(self._steps) for request_id, s in self._running.items()}
        return {**{s.request.request_id: 0 for s in self._waiting}, **produced}

    async def shutdown(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def account_until_now(self) -> None:
        """Bring `self.time` up to the current clock (it is otherwise updated at events only)."""
        self._advance()

    # -- the serving loop --------------------------------------------------------------------

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = time.thread_time()
            self._advance()
            self._complete_finished()
            self._admit()
            if not self._running and not self._waiting:
                self._drained.set()
            delay = self._next_event_in()
            self._wake.clear()
            self.cpu_s += time.thread_time() - started
            try:
                async with asyncio.timeout_at(None if delay is None else loop.time() + delay):
                    await self._wake.wait()
            except TimeoutError:
                continue

    def _decoding(self) -> bool:
        return bool(self._running) and self._pause in (None, PauseMode.WAIT)

    def _next_event_in(self) -> float | None:
        while self._heap and self._heap[0][2] not in self._running:  # aborted or cancelled meanwhile
            heapq.heappop(self._heap)
        if not self._decoding():
            return None
        steps_left = max(self._heap[0][0] - self._steps, 0.0)
        return self._prefill_backlog_s + steps_left * self.cost.step_s(len(self._running))

    def _advance(self) -> None:
        """Account the time since the last call: prefill first, then decode at the current batch."""
        now = asyncio.get_running_loop().time()
        elapsed, self._last = now - self._last, now
        if elapsed <= 0:
            return
        if not self._decoding():
            if self._pause is not None:
                self.time.paused_s += elapsed
            else:
                self.time.idle_s += elapsed
            return
        prefill = min(elapsed, self._prefill_backlog_s)
        self._prefill_backlog_s -= prefill
        self.time.prefill_s += prefill
        decode = elapsed - prefill
        batch = len(self._running)
        steps = decode / self.cost.step_s(batch)
        self._steps += steps
        self.time.tokens += steps * batch
        if self._pause is PauseMode.WAIT:
            self.time.drain_s += decode
            self.time.drain_tokens += steps * batch
        else:
            self.time.decode_s += decode

    def _admit(self) -> None:
        if self._pause is not None and self._pause is not PauseMode.WAIT:
            return
        while self._waiting and len(self._running) < self.cost.max_num_seqs:
            sequence = min(self._waiting, key=_priority)  # the first of the lowest priority: FIFO among equals
            prompt = sequence.request.prompt_ids
            cached = 0
            if self.kv is not None:
                found = self.kv.admit(sequence.request.request_id, prompt, sequence.target)
                if found is None:  # no room even after evicting every free block: it waits, and so do those after
                    return
                cached = found
            self._waiting.remove(sequence)
            sequence.start_step = self._steps
            sequence.done_at = self._steps + sequence.target
            sequence.spans.append((self._version, self._version, 0))
            prompt_tokens = len(prompt) - cached
            self._prefill_backlog_s += prompt_tokens * self.cost.prefill_per_token_s
            self.time.prefill_tokens += prompt_tokens
            self.time.cached_prompt_tokens += cached
            self._running[sequence.request.request_id] = sequence
            heapq.heappush(self._heap, (sequence.done_at, next(self._tiebreak), sequence.request.request_id))

    def _complete_finished(self) -> None:
        while self._heap and self._heap[0][0] <= self._steps + 1e-6:
            _, _, request_id = heapq.heappop(self._heap)
            sequence = self._running.pop(request_id, None)
            if sequence is None:
                continue
            self._release(sequence, sequence.target)
            if not sequence.future.done():
                sequence.future.set_result(self._result(sequence, sequence.target, FinishReason.LENGTH))

    def _finish_aborted(self, request_id: str) -> None:
        sequence = self._running.pop(request_id, None)
        if sequence is None:
            for waiting in self._waiting:
                if waiting.request.request_id == request_id:
                    self._waiting.remove(waiting)
                    sequence = waiting
                    break
        if sequence is None:
            return
        produced = sequence.produced(self._steps) if sequence.spans else 0
        self._release(sequence, produced)
        if sequence.future.done():
            return
        self.time.aborted_tokens += produced
        sequence.future.set_result(self._result(sequence, produced, FinishReason.ABORT))

    def _drop(self, request_id: str) -> None:
        sequence = self._running.pop(request_id, None)
        if sequence is not None:
            self._count_decoded(sequence, sequence.produced(self._steps))
            self._release(sequence, sequence.produced(self._steps))
        self._waiting = deque(s for s in self._waiting if s.request.request_id != request_id)
        self._wake.set()

    def _release(self, sequence: _Sequence, produced: int) -> None:
        """Its KV blocks back to the cache: the prompt's and the `produced` tokens' full blocks stay cached."""
        if self.kv is not None:
            self.kv.release(sequence.request.request_id, (*sequence.request.prompt_ids, *(TOKEN_ID,) * produced))

    def _count_decoded(self, sequence: _Sequence, produced: int) -> None:
        self.decoded_by_row[sequence.request.request_id.split("/", 1)[0]] += produced

    def _result(self, sequence: _Sequence, produced: int, finish: FinishReason) -> GenerateResult:
        """Weight versions by span; a token's oldest version is its span's KV version (the first span's, unless a
        RECOMPUTE push computed the KV again), as in vLLM."""
        weight_versions: list[int] = []
        versions: list[int] = []
        ends = [start for _, _, start in sequence.spans[1:]] + [produced] * bool(sequence.spans)  # none: never ran
        self._count_decoded(sequence, produced)
        for (version, kv_version, start), end in zip(sequence.spans, ends, strict=True):  # no Python per token
            count = min(end, produced) - min(start, produced)
            weight_versions += [version] * count
            versions += [min(version, kv_version)] * count
        return GenerateResult(
            request_id=sequence.request.request_id,
            output_ids=(TOKEN_ID,) * produced,
            output_logprobs=(TOKEN_LOGPROB,) * produced,
            output_versions=tuple(versions),
            finish_reason=finish,
            engine=self.name,
            output_weight_versions=tuple(weight_versions) if weight_versions != versions else (),
        )
