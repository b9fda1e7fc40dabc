"""vLLM's `AsyncLLM` hosted in a Ray actor, and the in-process handle that speaks the `Engine` protocol.

Owns: engine start-up (on the nodes that offer its `ray_resources`), generation with per-token
weight versions, pause/resume, in-place weight reload, turning a request the engine library rejects
into `InvalidRequestError`, streaming (each engine's one delta channel: every streamed request's new
tokens gathered into one Ray object per tick, handed out by the handle to each request's stream), and the
watchdog: each launched engine is probed every
`probe_interval_s`; an actor that is gone, an engine core that errored, or in-flight requests with
no token for `stall_timeout_s` while not paused mark the engine dead, and every call waiting on it
(and every later one) fails with an `EngineDiedError` that names the engine and the last request it
accepted.
Does not own: routing between engines (`router.py`), the pause→push→resume sequence (`weight_sync.py`),
or platform defaults (`platform.py`, the one place that knows about CPU vs GPU).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, get_args

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from fullasync.config import EngineSection, ModelSection, RunConfig
from fullasync.engines.platform import (
    CPU_BIND_ENV,
    cpu_tensor_parallel_binding,
    engine_env_vars,
    is_cpu_platform,
    platform_engine_kwargs,
)
from fullasync.engines.protocol import (
    GenerateRequest,
    GenerateResult,
    InstallTiming,
    NamedTensors,
    PauseMode,
    TokenDelta,
    WeightsPayload,
    wait_until_set,
)
from fullasync.engines.shm_weights import WeightSender
from fullasync.engines.weight_digests import Served, mismatches, received_mismatches, sampled_names, served_digests
from fullasync.engines.weight_stream import StreamPlan
from fullasync.errors import EngineDiedError, InvalidRequestError, WeightInstallError
from fullasync.logs import progress
from fullasync.placement import check_ray_resources, require_cluster_offers, where_am_i
from fullasync.types import FinishReason

if TYPE_CHECKING:
    from vllm import RequestOutput, SamplingParams
    from vllm.logprobs import Logprob
    from vllm.outputs import WeightVersionSpan
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import RequestOutputCollector

log = logging.getLogger("fullasync")
T = TypeVar("T")

# Streamed requests' new tokens go to the driver at most this often, all of an engine's streams in one Ray object
# (at once after a quiet spell): one Ray object per vLLM step cost the driver ~1.7 ms of CPU per streamed token,
# and one per stream per 20 ms still ~0.8 ms at 64 streams, where a delta held about one token.
STREAM_DELTA_S = 0.02

EngineDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]  # vLLM's model dtypes
LogprobsMode = Literal["raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"]


@dataclass(frozen=True)
class VLLMEngineConfig:
    """How to start one vLLM engine.

    A run makes it from its `engine` section (`fullasync.api.engine_config`: every field both declare, plus the
    model's path and served name and the run's seed); the settings a run has take their defaults from there, so
    an engine started on its own gets the same ones. Their help is in `fullasync.config` (docs/config.md)."""

    model_path: str  # local HF model directory
    served_model_name: str = ModelSection.served_name
    dtype: str = "float32"  # a run's `engine.dtype=auto` is the trainer's precision (`fullasync.api.engine_config`)
    max_model_len: int = EngineSection.max_model_len
    max_num_seqs: int = EngineSection.max_num_seqs
    enable_prefix_caching: bool = True  # reuse KV of shared prefixes (multi-turn, resumed requests)
    logprobs_mode: str = "processed_logprobs"  # log-probs after temperature/top-p, i.e. of the sampling policy
    seed: int = RunConfig.seed
    max_logprobs: int = EngineSection.max_logprobs
    tensor_parallel_size: int = EngineSection.tensor_parallel_size
    extra_engine_kwargs: Mapping[str, Any] = field(default_factory=dict)  # passed to AsyncEngineArgs as is
    start_timeout_s: float = EngineSection.start_timeout_s
    call_timeout_s: float = 120.0  # bound on control calls (pause, resume, update, version)
    generate_timeout_s: float = 1800.0  # bound on one generate call
    probe_interval_s: float = EngineSection.probe_interval_s
    stall_timeout_s: float = EngineSection.stall_timeout_s
    ray_resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per engine: pins its node
    weight_bucket_bytes: int = 64 * 2**20  # weights pass to the engine core in buckets of whole layers this big

    def __post_init__(self) -> None:
        check_ray_resources("VLLMEngineConfig.ray_resources", self.ray_resources)
        for name, kind in (("dtype", EngineDType), ("logprobs_mode", LogprobsMode)):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"engine {name}={getattr(self, name)!r} is not one vLLM knows; choose one of "
                                 f"{list(get_args(kind))}")
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) \
                or self.tensor_parallel_size < 1:
            raise ValueError(f"engine tensor_parallel_size must be an integer >= 1, got {self.tensor_parallel_size!r}")
        if self.weight_bucket_bytes <= 0:
            raise ValueError(f"VLLMEngineConfig.weight_bucket_bytes must be > 0, got {self.weight_bucket_bytes}")


@dataclass(frozen=True)
class EngineHealth:
    """One watchdog probe: is the engine core alive, and has it produced anything lately."""

    in_flight: int
    paused: bool
    core_errored: bool
    seconds_without_progress: float  # since the last token, resume, or first in-flight request
    last_request_id: str | None


def _compact_json_grammar(schema: Any) -> str:
    """An EBNF grammar of the JSON values `schema` admits, written without whitespace between tokens."""
    import xgrammar

    return str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":")))


def _sampling_params(request: GenerateRequest) -> SamplingParams:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    opts = request.sampling
    structured = None
    if opts.structured is not None:
        kind, spec = opts.structured
        value = list(spec) if kind == "choice" and isinstance(spec, tuple) else spec
        if kind == "compact_json":  # vLLM's whitespace switch is per engine; a grammar holds one request to it
            structured = StructuredOutputsParams(grammar=_compact_json_grammar(value))
        else:
            structured = StructuredOutputsParams(**{kind: value})  # type: ignore[arg-type]  # `kind` names the field
    return SamplingParams(
        max_tokens=request.max_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k if opts.top_k > 0 else 0,
        min_p=opts.min_p,
        stop=list(opts.stop) or None,
        stop_token_ids=list(opts.stop_token_ids) or None,
        ignore_eos=opts.ignore_eos,
        seed=opts.seed,
        logprobs=opts.num_top_logprobs,
        output_kind=RequestOutputKind.DELTA,
        detokenize=bool(opts.stop),
        structured_outputs=structured,
    )


def _versions_from_spans(spans: list[WeightVersionSpan] | None, num_tokens: int, fallback: int) -> tuple[int, ...]:
    if not spans:
        return (fallback,) * num_tokens
    versions: list[int] = []
    for span in spans:
        versions += [int(span.version)] * (span.end - span.start)
    if len(versions) != num_tokens:
        raise RuntimeError(f"vLLM weight-version spans cover {len(versions)} of {num_tokens} tokens")
    return tuple(versions)


def _oldest_versions(weight_versions: tuple[int, ...], kv_version: int, recomputed: list[int]) -> tuple[int, ...]:
    """Each token's version: the older of its weights' and its KV's — the KV's being the version the request was
    submitted under, or that of the latest "recompute" push before the token was sampled."""
    if not recomputed:
        return tuple(min(version, kv_version) for version in weight_versions)
    return tuple(min(version, max([kv_version, *(r for r in recomputed if r <= version)]))
                 for version in weight_versions)


class VLLMEngineActor:
    """Hosts one `AsyncLLM`; every method runs on the actor's event loop."""

    def __init__(self, config: VLLMEngineConfig, name: str) -> None:
        self.config = config
        self.name = name
        self._llm: AsyncLLM | None = None
        self._version = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        # requests between reading the version and handing vLLM their ADD; a pause waits until none is (`_admitted`)
        self._admitting = 0
        self._none_admitting = asyncio.Event()
        self._none_admitting.set()
        self._progress: dict[str, int] = {}  # request id -> tokens received so far, while in flight
        self._recomputed: dict[str, list[int]] = {}  # request id -> versions whose push recomputed its KV, in flight
        self._pause_mode = PauseMode.ABORT
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

        from fullasync.engines import vllm_transfer

        vllm_transfer.check_installed()
        cfg = self.config
        if cfg.tensor_parallel_size > 1 and is_cpu_platform():
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
            **{**platform_engine_kwargs(), **dict(cfg.extra_engine_kwargs)},
        )
        self._llm = llm = AsyncLLM.from_engine_args(args)
        await llm.init_weight_transfer_engine(WeightTransferInitRequest())
        self._tied_embeddings = bool(getattr(AutoConfig.from_pretrained(cfg.model_path), "tie_word_embeddings", False))
        self._version = initial_version
        await llm.update_weight_version(str(initial_version))
        await self._warm_up(llm)

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
        want_top = request.sampling.num_top_logprobs > 0
        if not self._progress:
            self._progress_at = time.monotonic()
        self._progress[request.request_id] = 0
        recomputed: list[int] = []  # versions of "recompute" pushes while it runs (appended by update_weights)
        self._recomputed[request.request_id] = recomputed
        self._last_request_id = request.request_id
        try:
            kv_version, outputs = await self._admitted(request)
            async with contextlib.aclosing(outputs):  # left early: the request is aborted in vLLM
                async for out in outputs:
                    completion = out.outputs[0]
                    new_ids = list(completion.token_ids)
                    before = len(output_ids)
                    output_ids += new_ids
                    self._progress[request.request_id] = len(output_ids)
                    self._progress_at = time.monotonic()
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
            del self._progress[request.request_id]
            del self._recomputed[request.request_id]
        if finish_reason is None:
            raise RuntimeError(f"engine {self.name}: request {request.request_id} ended without a finish reason")
        weight_versions = _versions_from_spans(spans, len(output_ids), self._version)
        versions = _oldest_versions(weight_versions, kv_version, recomputed)
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
        )

    async def _admitted(self, request: GenerateRequest) -> tuple[int, AsyncGenerator[RequestOutput, None]]:
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
                _sampling_params(request), priority=request.priority,
            )
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
        idle = not self._progress or not self._resumed.is_set()
        return EngineHealth(
            in_flight=len(self._progress),
            paused=not self._resumed.is_set(),
            core_errored=self._llm is not None and self._llm.errored,
            seconds_without_progress=0.0 if idle else time.monotonic() - self._progress_at,
            last_request_id=self._last_request_id,
        )

    async def abort(self, request_ids: list[str]) -> None:
        await self._started().abort(request_ids)

    async def pause(self, mode: PauseMode) -> None:
        self._resumed.clear()  # requests not yet admitted wait for the resume (`_admitted`)
        await self._none_admitting.wait()  # those admitted reach the core before the pause does
        self._pause_mode = mode = PauseMode(mode)
        if mode is PauseMode.RECOMPUTE:  # preempts what runs: its KV is computed again after the update
            await self._started().pause_generation(mode="keep", clear_cache=True)
        else:
            await self._started().pause_generation(mode=mode.value, clear_cache=False)

    async def resume(self) -> None:
        await self._started().resume_generation()
        self._progress_at = time.monotonic()  # paused time is not a stall
        self._resumed.set()

    async def wait_resumed(self, timeout_s: float) -> bool:
        return await wait_until_set(self._resumed, timeout_s)

    async def is_paused(self) -> bool:
        return not self._resumed.is_set()

    async def install(self, named_tensors: NamedTensors, version: int, mode: PauseMode) -> InstallTiming:
        """pause → update_weights → resume in one call: one round trip per push. An update that fails leaves the
        engine paused — it serves nothing from weights loaded in part — until an install succeeds or it restarts.

        `named_tensors` is the mapping itself: Ray resolves the object reference `RayEngine.install` passes."""
        clock = time.perf_counter
        start = clock()
        await self.pause(mode)
        paused = clock()
        phases = await self.update_weights(named_tensors, version)
        updated = clock()
        await self.resume()
        return InstallTiming(paused - start, updated - paused, clock() - updated, phases)

    async def update_weights(self, named_tensors: NamedTensors | StreamPlan, version: int) -> dict[str, float]:
        """Reload weights in place and label what follows with `version`; the engine must be paused.

        Through vLLM's weight-transfer API with the shared-memory backend (`vllm_transfer.py`):
        `start_weight_update` → `update_weights`, during which each worker reads bucket i while this actor fills
        bucket i + 1 (`shm_weights.py`) → `finish_weight_update(version)`, after which the engine reports
        `version` itself (`served_version`); then the checksums of a sample are compared.
        Returns seconds per phase: copy_s (filling buckets), load_s (until vLLM reloaded the last),
        reset_s (prefix cache and version label), and the hand-off file's size (shm_bytes).
        """
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if self._resumed.is_set():
            raise RuntimeError(f"engine {self.name}: pause the engine before update_weights (see WeightSync)")
        if isinstance(named_tensors, StreamPlan):
            return await self._receive_stream(named_tensors, version)
        tensors = dict(named_tensors)
        if self._tied_embeddings and "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
            # vLLM's CPU output layer keeps its own packed copy of tied embeddings; it is
            # refreshed only when lm_head.weight is among the loaded weights.
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        llm = self._started()
        started = time.perf_counter()
        timeout = self.config.call_timeout_s
        layout, buckets = self._weights.prepare(tensors, timeout, readers=self.config.tensor_parallel_size)
        received = threading.Event()
        await llm.start_weight_update()
        request = WeightTransferUpdateRequest({"layout": layout.as_dict()})
        update = asyncio.ensure_future(llm.update_weights(request))
        update.add_done_callback(lambda _: received.set())
        try:
            copy_s = await asyncio.to_thread(self._weights.send, buckets, received, timeout)
        except BaseException:
            self._weights.abandon()
            await asyncio.gather(update, return_exceptions=True)
            raise
        await update
        phases = await self._serve(version, started, lambda: self._check_served(tensors, version))
        return {"copy_s": copy_s, **phases, "buckets": float(len(buckets)),
                "shm_bytes": float(self._weights.file_bytes)}

    async def _serve(self, version: int, started: float, check: Callable[[], Awaitable[int]]) -> dict[str, float]:
        """After the last tensor is loaded: label what the engine serves with `version` (vLLM's own label too),
        `check` it (how many tensors compared; it raises on a mismatch, and the label is taken back), drop the
        prefix cache. Returns load_s (since `started`), verify_s, reset_s and checked_tensors."""
        llm = self._started()
        await llm.finish_weight_update(str(version))  # the engine now labels what it serves with `version`
        loaded = time.perf_counter()
        try:
            checked = await check()
        except BaseException:
            await llm.update_weight_version(str(self._version))  # it does not serve `version`: take the label back
            raise
        verified = time.perf_counter()
        await llm.reset_prefix_cache()
        self._version = version
        if self._pause_mode is PauseMode.RECOMPUTE:  # what is in flight prefills again under `version`
            for versions in self._recomputed.values():
                versions.append(version)
        return {"load_s": loaded - started, "verify_s": verified - loaded, "reset_s": time.perf_counter() - verified,
                "checked_tensors": float(checked)}

    async def _receive_stream(self, plan: StreamPlan, version: int) -> dict[str, float]:
        """`update_weights` of a streamed push: every worker takes the buckets the trainer's rank 0 broadcasts
        (`weight_stream.py`) and loads them; then the sampled tensors, checked on arrival against the sender's
        digests, are compared with what each worker's model holds."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        llm = self._started()
        started = time.perf_counter()
        await llm.start_weight_update()
        await llm.update_weights(WeightTransferUpdateRequest({"stream": plan.as_dict()}))
        phases = await self._serve(version, started, lambda: self._check_received(version))
        return {**phases, "buckets": float(len(plan.buckets))}

    async def _check_received(self, version: int) -> int:
        """Each worker's sampled tensors of a streamed push, as received, against what its model holds now."""
        checked = 0
        for compared, wrong in await self._started().collective_rpc(received_mismatches):  # type: ignore[arg-type]
            if wrong:
                raise WeightInstallError(f"engine {self.name}: after loading streamed weight version {version}, "
                                         f"{len(wrong)} of {compared} checked tensors differ from those received "
                                         f"(e.g. {wrong[:3]})")
            checked += compared
        return checked

    async def _check_served(self, tensors: NamedTensors, version: int) -> int:
        """Digests of a sample of the pushed tensors against what every worker's model holds now; raises
        `WeightInstallError` naming those that differ. Returns how many tensors were compared."""
        served = await self.weight_digests(sampled_names({name: t.dim() for name, t in tensors.items()}, version))
        checked = 0
        for held in served:
            compared, wrong = mismatches(tensors, held)
            if wrong:
                raise WeightInstallError(f"engine {self.name}: after loading weight version {version}, {len(wrong)} "
                                         f"of {compared} checked tensors differ from those pushed (e.g. {wrong[:3]})")
            checked += compared
        return checked

    async def weight_digests(self, names: list[str]) -> list[Served]:
        """Shape, dtype and SHA-256 of each named tensor every worker's model holds (one dict per worker)."""
        return await self._started().collective_rpc(served_digests(names))  # type: ignore[arg-type]

    async def check_weights(self, named_tensors: NamedTensors) -> tuple[int, list[str]]:
        """Every tensor of `named_tensors` that the engine holds by that name and shape, compared with what it
        serves: (how many compared, those that differ)."""
        tensors = dict(named_tensors)
        compared, wrong = 0, set[str]()
        for held in await self.weight_digests(sorted(tensors)):
            count, differ = mismatches(tensors, held)
            compared, wrong = max(compared, count), wrong | set(differ)
        return compared, sorted(wrong)

    async def version(self) -> int:
        return self._version

    async def served_version(self) -> int:
        """The weight version vLLM itself reports serving (set by `finish_weight_update`)."""
        return int(await self._started().get_weight_version())

    async def vllm_weight_checksums(self) -> list[dict[str, str]]:
        """vLLM's own SHA-256 of every parameter, one dict per worker (names prefixed `dp0:pp0:pcp0:tp<rank>:`)."""
        return await self._started().compute_weight_checksums()

    def placement(self) -> tuple[str, list[str]]:
        """This actor's node and the GPU ids Ray assigned it."""
        return where_am_i()

    async def num_in_flight(self) -> int:
        return len(self._progress)

    async def in_flight_tokens(self) -> dict[str, int]:
        """Tokens generated so far by each in-flight request (progress of long generations)."""
        return dict(self._progress)

    async def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        self._weights.close()


class RayEngine:
    """In-process handle to a `VLLMEngineActor`; implements `Engine` with timeouts on every call.

    `watch()` starts the watchdog task (`launch_vllm_engines` does); `death` is the error that
    marked the engine dead, or None while it serves.
    """

    def __init__(self, actor: ActorHandle[VLLMEngineActor], name: str, config: VLLMEngineConfig) -> None:
        self.actor = actor
        self.name = name
        self.config = config
        self.workers = config.tensor_parallel_size  # a streamed push reaches each of its tensor-parallel ranks
        self.death: EngineDiedError | None = None
        self.restarts = 0
        self.calls: dict[str, int] = {}  # control calls made to the actor so far, by method (round trips)
        self._waiting: set[asyncio.Future[Any]] = set()  # calls to fail at once if the engine dies (any reply)
        self._watchdog: asyncio.Task[None] | None = None
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
        self.actor = _spawn_actor(self.config, self.name, f"{self.name}-r{self.restarts}")
        await self._call("start", version, timeout_s=self.config.start_timeout_s, even_if_dead=True)
        if weights is not None:
            await self._call("install", weights, version, PauseMode.ABORT, even_if_dead=True)
        self.death = None
        self.watch()
        log.warning("engine %s restarted (restart %d) serving version %d", self.name, self.restarts, version)

    # -- liveness ------------------------------------------------------------------------------

    def watch(self) -> None:
        """Start probing the engine every `probe_interval_s` (idempotent)."""
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch(), name=f"watchdog-{self.name}")

    async def _watch(self) -> None:
        cfg = self.config
        while self.death is None:
            await asyncio.sleep(cfg.probe_interval_s)
            try:
                health: EngineHealth = await asyncio.wait_for(self.actor.health.remote(), cfg.stall_timeout_s)
            except RayActorError as error:
                self.mark_dead(f"its actor is gone ({type(error).__name__})", None)
            except (TimeoutError, GetTimeoutError):
                self.mark_dead(f"it did not answer a health probe within {cfg.stall_timeout_s:.0f} s", None)
            else:
                if health.core_errored:
                    self.mark_dead("its vLLM engine core has failed", health.last_request_id)
                elif health.seconds_without_progress > cfg.stall_timeout_s:
                    self.mark_dead(
                        f"{health.in_flight} in-flight request(s) made no progress for "
                        f"{health.seconds_without_progress:.0f} s (engine.stall_timeout_s={cfg.stall_timeout_s:g})",
                        health.last_request_id,
                    )

    def mark_dead(self, reason: str, last_request_id: str | None = None) -> None:
        """Declare the engine dead: waiting calls and every later call fail with an error naming it."""
        if self.death is not None:
            return
        last = f"; the last request it accepted was {last_request_id}" if last_request_id else ""
        self.death = EngineDiedError(f"engine {self.name} is dead: {reason}{last}")
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_exception(self.death)
        self._waiting.clear()

    async def _watched(self, awaitable: Awaitable[T], what: str, timeout_s: float, even_if_dead: bool = False) -> T:
        """Await a reply of the actor, but give up at once if the engine is declared dead meanwhile.

        A call abandoned (timeout, or the caller cancelled) is cancelled in the actor too, which
        aborts its vLLM request and frees the slot. `even_if_dead`: a restart talking to its new actor.
        """
        if self.death is not None and not even_if_dead:
            raise self.death
        reply = asyncio.ensure_future(awaitable)
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        reply.add_done_callback(lambda done: _transfer(done, waiter))
        if not even_if_dead:
            self._waiting.add(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter
        except RayTaskError as error:
            if isinstance(error.cause, InvalidRequestError):
                raise error.cause from None
            raise
        except RayActorError as error:
            self.mark_dead(f"its actor died during {what} ({type(error).__name__})", None)
            raise EngineDiedError(f"engine {self.name} died during {what}: {error}") from error
        except (TimeoutError, GetTimeoutError) as error:
            raise TimeoutError(f"engine {self.name}: {what} took longer than {timeout_s:.0f} s") from error
        finally:
            self._waiting.discard(waiter)
            if not reply.done():
                reply.cancel()
                if isinstance(awaitable, ray.ObjectRef) and self.death is None:
                    ray.cancel(awaitable)

    async def _call(self, method: str, *args: object, timeout_s: float | None = None,
                    even_if_dead: bool = False) -> Any:
        """Call the actor's `method`; its reply (Any: Ray's actor methods are untyped, each caller states the type)."""
        timeout = self.config.call_timeout_s if timeout_s is None else timeout_s
        self.calls[method] = self.calls.get(method, 0) + 1
        return await self._watched(getattr(self.actor, method).remote(*args), method, timeout, even_if_dead)

    # -- the Engine protocol -----------------------------------------------------------------

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
        await self._call("pause", PauseMode(mode))

    async def resume(self) -> None:
        await self._call("resume")

    async def wait_resumed(self, timeout_s: float) -> bool:
        return await self._call("wait_resumed", timeout_s, timeout_s=timeout_s + self.config.call_timeout_s)

    async def update_weights(self, weights: WeightsPayload, version: int) -> None:
        await self._call("update_weights", weights, version)

    async def install(self, weights: WeightsPayload, version: int, mode: PauseMode) -> InstallTiming:
        """A Ray object reference travels as a reference: the actor reads the tensors from the object store."""
        return await self._call("install", weights, version, PauseMode(mode))

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


def _transfer(source: asyncio.Future[T], target: asyncio.Future[T]) -> None:
    """Hand an actor's reply to the waiting caller (reading it even when nobody waits any more)."""
    if source.cancelled():
        if not target.done():
            target.cancel()
        return
    error = source.exception()
    if target.done():
        return
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def engine_actor_options(config: VLLMEngineConfig, actor_name: str, on_gpu: bool) -> dict[str, Any]:
    """Ray options of one engine actor: on GPU it reserves its `tensor_parallel_size` GPUs (one node: Ray places an
    actor whole), so Ray sets its CUDA_VISIBLE_DEVICES and no two engines share a GPU; on CPU it reserves none."""
    return dict(name=actor_name, num_cpus=0, num_gpus=config.tensor_parallel_size if on_gpu else 0,
                max_concurrency=4096, resources=dict(config.ray_resources))


def _spawn_actor(config: VLLMEngineConfig, name: str, actor_name: str) -> ActorHandle[VLLMEngineActor]:
    options = engine_actor_options(config, actor_name, on_gpu=not is_cpu_platform())
    actor = ray.remote(VLLMEngineActor).options(
        **options, runtime_env={"env_vars": engine_env_vars()},
    ).remote(config, name)
    return cast("ActorHandle[VLLMEngineActor]", actor)  # Ray types `.remote()` as a handle or the class


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
        engines.append(RayEngine(_spawn_actor(config, name, name), name, config))
    began = time.perf_counter()

    async def start(engine: RayEngine) -> None:
        await engine._call("start", initial_version, timeout_s=config.start_timeout_s)
        ready.append(engine.name)
        log.info("engine %d/%d ready: %s (%.1f s)", len(ready), num_engines, engine.name, time.perf_counter() - began,
                 extra=progress("engines", len(ready), num_engines))

    ready: list[str] = []
    await asyncio.gather(*(start(e) for e in engines))
    for engine in engines:
        engine.watch()
    return engines
