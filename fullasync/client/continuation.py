"""Generation that survives weight pushes: an aborted request is resubmitted with its tokens so far.

Owns: the resubmission loop. After `finish_reason == "abort"` it waits (bounded) for the engine to
resume, then sends prompt + tokens generated so far with the remaining budget, and stitches ids,
log-probs and per-token versions. The caller's `max_tokens` bounds the total, whatever the number
of interruptions. A segment lost to an engine that died is resubmitted the same way on a live
engine (when one is left — or is restarted within `restart_wait_s` — and, for a stream, when none
of the lost segment's tokens were sent yet).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from fullasync.contracts.engine import GenerateRequest, GenerateResult, SamplingOptions, TokenDelta
from fullasync.engines.router import EngineRouter
from fullasync.errors import EngineDiedError, EngineResumeTimeoutError
from fullasync.types import FinishReason


@dataclass
class StitchedGeneration:
    """The tokens of one logical generation, possibly produced by several engine requests."""

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    output_weight_versions: list[int] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.LENGTH
    stop_reason: int | str | None = None
    num_resumes: int = 0
    resubmitted_tokens: int = 0
    engine: str = ""


def _request(request_id: str, prompt_ids: list[int], done: StitchedGeneration, max_tokens: int,
             sampling: SamplingOptions, priority: Callable[[], int]) -> GenerateRequest:
    """The next engine request of a logical generation: prompt + tokens so far, remaining budget, and the
    priority its episode has now (a resubmission after a push is served by the row's age then)."""
    return GenerateRequest(
        request_id=f"{request_id}-{done.num_resumes}",
        prompt_ids=tuple(prompt_ids) + tuple(done.output_ids),
        max_tokens=max_tokens - len(done.output_ids),
        sampling=sampling,
        priority=priority(),
    )


def no_priority() -> int:
    return 0


@dataclass(frozen=True)
class InfraHooks:
    """What a generation tells its episode about the infrastructure: `waiting()` wraps a wait for a dead engine
    to be restarted (the episode's deadline stops meanwhile), `failed()` comes before an infrastructure error
    (an engine gone for good, a push that never resumed) is raised to the harness."""

    waiting: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
    failed: Callable[[], None] = lambda: None


NO_HOOKS = InfraHooks()


async def _absorb(router: EngineRouter, episode_id: str, request_id: str, done: StitchedGeneration,
                  result: GenerateResult, max_tokens: int, resume_timeout_s: float) -> bool:
    """Stitch `result` into `done`; True when the generation is complete, else ready to resubmit."""
    done.output_ids += result.output_ids
    done.output_logprobs += result.output_logprobs
    done.output_versions += result.output_versions
    done.output_weight_versions += result.output_weight_versions or result.output_versions
    done.top_logprobs += result.top_logprobs
    done.engine = result.engine
    if result.finish_reason is not FinishReason.ABORT:
        done.finish_reason, done.stop_reason = result.finish_reason, result.stop_reason
        return True
    if len(done.output_ids) >= max_tokens:
        done.finish_reason = FinishReason.LENGTH
        return True
    engine = router.pick(episode_id)
    if not await engine.wait_resumed(resume_timeout_s):
        raise EngineResumeTimeoutError(
            f"engine {engine.name} did not resume within {resume_timeout_s:.0f} s after interrupting "
            f"request {request_id}; raise client resume_timeout_s or check the weight sync"
        )
    done.num_resumes += 1
    done.resubmitted_tokens += len(done.output_ids)
    return False


async def generate_with_resume(
    router: EngineRouter,
    episode_id: str,
    request_id: str,
    prompt_ids: list[int],
    max_tokens: int,
    sampling: SamplingOptions,
    resume_timeout_s: float,
    restart_wait_s: float = 0.0,
    on_versions: Callable[[tuple[int, ...]], None] | None = None,
    infra: InfraHooks = NO_HOOKS,
    priority: Callable[[], int] = no_priority,
) -> StitchedGeneration:
    """Generate up to `max_tokens` tokens after `prompt_ids`, resuming across aborts; `on_versions` gets the
    versions of every segment's tokens as it comes back (interrupted segments too)."""
    done = StitchedGeneration()
    while True:
        request = _request(request_id, prompt_ids, done, max_tokens, sampling, priority)
        try:
            result = await router.generate(request, episode_id)
            if on_versions is not None:
                on_versions(result.output_versions)
            finished = await _absorb(router, episode_id, request_id, done, result, max_tokens, resume_timeout_s)
        except EngineDiedError as error:
            await _after_engine_death(router, done, error, restart_wait_s, infra)
            continue
        except EngineResumeTimeoutError:
            infra.failed()
            raise
        except asyncio.CancelledError:  # the caller gave up (its harness went away): free the engine's slot now
            await router.pick(episode_id).abort([request.request_id])
            raise
        if finished:
            return done


async def _after_engine_death(router: EngineRouter, done: StitchedGeneration, error: EngineDiedError,
                              restart_wait_s: float, infra: InfraHooks) -> None:
    """A segment died with its engine: count its resubmission, or re-raise when no engine serves (in time). The
    wait for a restart does not count against the episode's deadline (`infra.waiting`)."""
    with infra.waiting():
        alive = await router.wait_alive(restart_wait_s)
    if not alive:
        infra.failed()
        raise error
    done.num_resumes += 1
    done.resubmitted_tokens += len(done.output_ids)


class _Held:
    """Tokens received but not yet yielded (a stream interval above 1): what came from finished segments (in the
    stitched generation already) and what the running segment sent so far."""

    def __init__(self) -> None:
        self.absorbed: list[TokenDelta] = []
        self.segment: list[TokenDelta] = []
        self.tokens = 0

    def add(self, delta: TokenDelta) -> None:
        self.segment.append(delta)
        self.tokens += len(delta.output_ids)

    def take(self) -> TokenDelta:
        """All held tokens as one delta."""
        deltas, self.absorbed, self.segment, self.tokens = self.absorbed + self.segment, [], [], 0
        if len(deltas) == 1:
            return deltas[0]
        return TokenDelta(output_ids=tuple(i for d in deltas for i in d.output_ids),
                          output_logprobs=tuple(p for d in deltas for p in d.output_logprobs),
                          top_logprobs=tuple(t for d in deltas for t in d.top_logprobs))

    def segment_ended(self, absorbed: bool) -> None:
        """The running segment's tokens joined the stitched generation (`absorbed`), or died with their engine."""
        if absorbed:
            self.absorbed += self.segment
        else:
            self.tokens -= sum(len(d.output_ids) for d in self.segment)
        self.segment = []


async def stream_with_resume(
    router: EngineRouter,
    episode_id: str,
    request_id: str,
    prompt_ids: list[int],
    max_tokens: int,
    sampling: SamplingOptions,
    resume_timeout_s: float,
    restart_wait_s: float = 0.0,
    on_versions: Callable[[tuple[int, ...]], None] | None = None,
    infra: InfraHooks = NO_HOOKS,
    interval: int = 1,
    priority: Callable[[], int] = no_priority,
) -> AsyncIterator[TokenDelta | StitchedGeneration]:
    """Like `generate_with_resume`, yielding token deltas as they come; the stitched whole comes last.

    An interruption is invisible in the deltas: after the resume they simply continue. `interval` > 1 (vLLM's
    `--stream-interval`): the first delta goes out as it comes, later ones once at least `interval` new tokens are
    there, and the rest just before the whole; tokens held back when their engine dies are generated again.
    """
    done = StitchedGeneration()
    held = _Held()
    first = True
    request, result = None, None
    try:
        while True:
            request, result, sent = _request(request_id, prompt_ids, done, max_tokens, sampling, priority), None, False
            try:
                async for item in router.generate_stream(request, episode_id):
                    if isinstance(item, GenerateResult):
                        result = item
                        continue
                    held.add(item)
                    if first or held.tokens >= interval:
                        first, sent = False, True
                        yield held.take()
                if result is None:
                    raise RuntimeError(f"engine stream for {request.request_id} ended without a result")
                if on_versions is not None:
                    on_versions(result.output_versions)
                held.segment_ended(absorbed=True)
                finished = await _absorb(router, episode_id, request_id, done, result, max_tokens, resume_timeout_s)
            except EngineDiedError as error:
                if sent and result is None:  # the consumer saw tokens no record will hold: the stream cannot go on
                    infra.failed()
                    raise
                held.segment_ended(absorbed=False)
                await _after_engine_death(router, done, error, restart_wait_s, infra)
                request = None
                continue
            if finished:
                if held.tokens:
                    yield held.take()
                yield done
                return
    except EngineResumeTimeoutError:
        infra.failed()
        raise
    finally:
        if request is not None and result is None:  # abandoned mid-generation: free the engine's slot
            await router.pick(episode_id).abort([request.request_id])
