"""`RayEngine`: the in-process handle that speaks the `Engine` protocol to one `VLLMEngineActor`.

Owns: bounded calls through the watchdog (`watchdog.py`), restart of a dead engine under the weights it should
serve, and the stream fan-out: each engine's one delta channel (every streamed request's new tokens gathered into one
Ray object per tick) handed out to each request's stream.
Does not own: routing between engines (`fullasync.engines.router`) or the pause→push→resume sequence
(`fullasync.weights.sync`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from fullasync.contracts.engine import (
    GenerateRequest,
    GenerateResult,
    InstallTiming,
    KVStats,
    PauseMode,
    TokenDelta,
)
from fullasync.contracts.weights import WeightsPayload
from fullasync.engines.vllm.actor import VLLMEngineActor, spawn_actor
from fullasync.engines.vllm.config import VLLMEngineConfig
from fullasync.engines.vllm.watchdog import WatchedActor

log = logging.getLogger("fullasync")


class RayEngine(WatchedActor):
    """In-process handle to a `VLLMEngineActor`; implements `Engine` with timeouts on every call.

    `watch()` starts the watchdog task (`launch_vllm_engines` does); `death` is the error that
    marked the engine dead, or None while it serves.
    """

    def __init__(self, actor: ActorHandle[VLLMEngineActor], name: str, config: VLLMEngineConfig) -> None:
        super().__init__(actor, name, config)
        self.workers = config.tensor_parallel_size  # a streamed push reaches each of its tensor-parallel ranks
        self.restarts = 0
        self.kv_tokens: int | None = None  # its KV cache's capacity in tokens (`read_kv_capacity`): the router's room
        self._channel: asyncio.Task[None] | None = None  # reads the actor's `deltas()`; started by the first stream
        self._channel_actor: ActorHandle[VLLMEngineActor] | None = None
        self._listeners: dict[str, Callable[[TokenDelta | None], None]] = {}  # stream key -> its queue's put
        self._stream_keys = itertools.count()

    async def restart(self, weights: WeightsPayload | None, version: int) -> None:
        """Replace a dead engine by a fresh actor serving `weights` (None: the model's own) as `version`."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        ray.kill(self.actor)  # whatever is left of the old one
        self.restarts += 1
        self.actor = spawn_actor(self.config, self.name, f"{self.name}-r{self.restarts}")
        await self._call("start", version, timeout_s=self.config.start_timeout_s, even_if_dead=True)
        await self.read_kv_capacity(even_if_dead=True)
        if weights is not None:
            await self._call("install", weights, version, PauseMode.ABORT, even_if_dead=True)
        self.death = None
        self.watch()
        log.warning("engine %s restarted (restart %d) serving version %d", self.name, self.restarts, version)


    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self._call("generate", request, timeout_s=self.config.generate_timeout_s)

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        """Deltas from the engine's one delta channel (`_fan_out`), then the `generate_published` call's result.

        The result holds every token: whatever the channel had not delivered when it came is one last delta, and
        the channel's later items for this call are dropped (each call publishes under a key of its own, so a
        resubmission of the same request id never receives an earlier attempt's tokens).
        """
        self._open_channel()
        key = f"{request.request_id}#{next(self._stream_keys)}"
        deltas: asyncio.Queue[TokenDelta | None] = asyncio.Queue()
        self._listeners[key] = deltas.put_nowait
        reply = asyncio.ensure_future(self._call("generate_published", request, key,
                                                 timeout_s=self.config.generate_timeout_s))
        reply.add_done_callback(lambda _: deltas.put_nowait(None))
        sent = 0
        try:
            while (delta := await deltas.get()) is not None:
                sent += len(delta.output_ids)
                yield delta
            result: GenerateResult = await reply
            if len(result.output_ids) > sent:
                yield TokenDelta(result.output_ids[sent:], result.output_logprobs[sent:], result.top_logprobs[sent:])
            yield result
        finally:
            del self._listeners[key]
            if not reply.done():
                reply.cancel()  # the actor's call is cancelled too: vLLM aborts the request and frees its slot

    def _open_channel(self) -> None:
        """Start reading the current actor's delta channel, unless that is under way."""
        if self._channel is None or self._channel_actor is not self.actor:
            if self._channel is not None:
                self._channel.cancel()
            self._channel_actor = self.actor
            self._channel = asyncio.create_task(self._fan_out(self.actor), name=f"deltas-{self.name}")

    async def _fan_out(self, actor: ActorHandle[VLLMEngineActor]) -> None:
        """Hand each of the channel's items out to the streams it names (those still listening)."""
        stream: ray.ObjectRefGenerator = actor.deltas.options(num_returns="streaming").remote()
        try:
            async for ref in stream:
                batch: dict[str, TokenDelta] = await ref
                for key, delta in batch.items():
                    listener = self._listeners.get(key)
                    if listener is not None:
                        listener(delta)
        except (RayActorError, RayTaskError) as error:  # streams still get every token, from their results
            if self.death is None:
                log.warning("engine %s: its delta channel ended (%s)", self.name, type(error).__name__)
        finally:
            if self._channel_actor is actor:
                self._channel = None

    async def abort(self, request_ids: list[str]) -> None:
        await self._call("abort", request_ids)

    async def check_weights(self, weights: WeightsPayload) -> tuple[int, list[str]]:
        """Compare every tensor of `weights` the engine holds by name and shape with what it serves: (how many
        compared, the names that differ)."""
        return await self._call("check_weights", weights)

    async def pause(self, mode: PauseMode) -> None:
        await self._call("pause", PauseMode(mode), timeout_s=self._pause_timeout_s)

    @property
    def _pause_timeout_s(self) -> float:
        """A pause may first wait for starved requests' tokens (`starved_wait_s`), then it is a control call."""
        return self.config.call_timeout_s + self.config.starved_wait_s

    async def resume(self) -> None:
        await self._call("resume")

    async def wait_resumed(self, timeout_s: float) -> bool:
        return await self._call("wait_resumed", timeout_s, timeout_s=timeout_s + self.config.call_timeout_s)

    async def update_weights(self, weights: WeightsPayload, version: int) -> None:
        await self._call("update_weights", weights, version)

    async def install(self, weights: WeightsPayload, version: int, mode: PauseMode) -> InstallTiming:
        """A Ray object reference travels as a reference: the actor reads the tensors from the object store."""
        return await self._call("install", weights, version, PauseMode(mode), timeout_s=self._pause_timeout_s)

    async def version(self) -> int:
        return await self._call("version")

    async def served_version(self) -> int:
        return await self._call("served_version")

    async def vllm_weight_checksums(self) -> list[dict[str, str]]:
        return await self._call("vllm_weight_checksums")

    async def placement(self) -> tuple[str, list[str]]:
        return await self._call("placement")

    async def num_in_flight(self) -> int:
        return await self._call("num_in_flight")

    async def in_flight_tokens(self) -> dict[str, int]:
        return await self._call("in_flight_tokens")

    async def kv_stats(self) -> KVStats | None:
        return await self._call("kv_stats")

    async def read_kv_capacity(self, even_if_dead: bool = False) -> None:
        """Learn the KV cache's capacity (the blocks vLLM allocated at start, times their size) for `kv_tokens`."""
        stats: KVStats | None = await self._call("kv_stats", even_if_dead=even_if_dead)
        self.kv_tokens = stats.capacity_tokens if stats is not None and stats.capacity_tokens else None

    async def shutdown(self) -> None:
        """Stop the watchdog, shut vLLM down (its engine core too, even when declared dead), kill the actor."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._channel is not None:
            self._channel.cancel()
        try:
            await asyncio.wait_for(self.actor.shutdown.remote(), self.config.call_timeout_s)
        except (RayActorError, RayTaskError, TimeoutError, GetTimeoutError) as error:  # killed below regardless
            log.warning("engine %s: shutdown failed (%s); killing its actor", self.name, error)
        finally:
            ray.kill(self.actor)
