"""Generation that survives weight pushes: an aborted request is resubmitted with its tokens so far.

Owns: the resubmission loop. After `finish_reason == "abort"` it waits (bounded) for the engine to
resume, then sends prompt + tokens generated so far with the remaining budget, and stitches ids,
log-probs and per-token versions. The caller's `max_tokens` bounds the total, whatever the number
of interruptions. A segment lost to an engine that died is resubmitted the same way on a live
engine (when one is left — or is restarted within `restart_wait_s` — and, for a stream, when none
of the lost segment's tokens were sent yet). Each resubmission says how many interruptions in a row came before
it produced a token (`GenerateRequest.starved`): the engine does not let pushes starve it.
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
    starved: int = 0  # interruptions in a row that came before a token (the engine's starvation rule reads it)
    starved_resumes: int = 0  # of all its interruptions, those that came before a token
    engine: str = ""


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


@dataclass(frozen=True)
class ResumableCall:
    """One logical generation: `max_tokens` tokens after `prompt_ids`, resubmitted (prompt + tokens so far) after
    each interruption. `resume_timeout_s` bounds the wait for a paused engine to resume, `restart_wait_s` the wait
    for a dead one to be restarted; `on_versions` gets every segment's token versions as it comes back
    (interrupted segments too), `priority` the episode's engine priority at each (re)submission."""

    router: EngineRouter
    episode_id: str
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingOptions
    resume_timeout_s: float
    restart_wait_s: float = 0.0
    on_versions: Callable[[tuple[int, ...]], None] | None = None
    infra: InfraHooks = NO_HOOKS
    priority: Callable[[], int] = no_priority

    def request(self, done: StitchedGeneration) -> GenerateRequest:
        """The next engine request: prompt + tokens so far, the remaining budget, and the priority the episode has
        now (a resubmission after a push is served by the row's age then)."""
        return GenerateRequest(
            request_id=f"{self.request_id}-{done.num_resumes}",
            prompt_ids=tuple(self.prompt_ids) + tuple(done.output_ids),
            max_tokens=self.max_tokens - len(done.output_ids),
            sampling=self.sampling,
            priority=self.priority(),
            starved=done.starved,
        )

    def note_versions(self, result: GenerateResult) -> None:
        if self.on_versions is not None:
            self.on_versions(result.output_versions)


async def _absorb(call: ResumableCall, done: StitchedGeneration, result: GenerateResult) -> bool:
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
    if len(done.output_ids) >= call.max_tokens:
        done.finish_reason = FinishReason.LENGTH
        return True
    done.starved = 0 if result.output_ids else done.starved + 1
    done.starved_resumes += not result.output_ids
    engine = call.router.pick(call.episode_id)
    if not await engine.wait_resumed(call.resume_timeout_s):
        raise EngineResumeTimeoutError(
            f"engine {engine.name} did not resume within {call.resume_timeout_s:.0f} s after interrupting "
            f"request {call.request_id}; raise client resume_timeout_s or check the weight sync"
        )
    done.num_resumes += 1
    done.resubmitted_tokens += len(done.output_ids)
    return False


async def _admitted(call: ResumableCall, request: GenerateRequest) -> None:
    """Count the request's KV (prompt and likely answer) to its episode's engine; a new episode's first call may
    wait for room (`EngineRouter.admit`), and that wait does not count against the episode's deadline."""
    bound = call.router.bound(call.episode_id)  # its calls never wait: no deadline to pause
    with contextlib.nullcontext() if bound else call.infra.waiting():
        await call.router.admit(call.episode_id, len(request.prompt_ids), request.max_tokens)


async def generate_with_resume(call: ResumableCall) -> StitchedGeneration:
    """The call's generation, resumed across aborts and engine restarts, stitched into one."""
    done = StitchedGeneration()
    while True:
        request = call.request(done)
        try:
            await _admitted(call, request)
            result = await call.router.generate(request, call.episode_id)
            call.note_versions(result)
            finished = await _absorb(call, done, result)
        except EngineDiedError as error:
            await _after_engine_death(call, done, error)
            continue
        except EngineResumeTimeoutError:
            call.infra.failed()
            raise
        except asyncio.CancelledError:  # the caller gave up (its harness went away): free the engine's slot now
            await call.router.pick(call.episode_id).abort([request.request_id])
            raise
        if finished:
            call.router.settle(call.episode_id, len(call.prompt_ids), len(done.output_ids))
            return done


async def _after_engine_death(call: ResumableCall, done: StitchedGeneration, error: EngineDiedError) -> None:
    """A segment died with its engine: count its resubmission, or re-raise when no engine serves (in time). The
    wait for a restart does not count against the episode's deadline (`infra.waiting`)."""
    with call.infra.waiting():
        alive = await call.router.wait_alive(call.restart_wait_s)
    if not alive:
        call.infra.failed()
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


async def stream_with_resume(call: ResumableCall, interval: int = 1) -> AsyncIterator[TokenDelta | StitchedGeneration]:
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
            request, result, sent = call.request(done), None, False
            try:
                await _admitted(call, request)
                async for item in call.router.generate_stream(request, call.episode_id):
                    if isinstance(item, GenerateResult):
                        result = item
                        continue
                    held.add(item)
                    if first or held.tokens >= interval:
                        first, sent = False, True
                        yield held.take()
                if result is None:
                    raise RuntimeError(f"engine stream for {request.request_id} ended without a result")
                call.note_versions(result)
                held.segment_ended(absorbed=True)
                finished = await _absorb(call, done, result)
            except EngineDiedError as error:
                if sent and result is None:  # the consumer saw tokens no record will hold: the stream cannot go on
                    call.infra.failed()
                    raise
                held.segment_ended(absorbed=False)
                await _after_engine_death(call, done, error)
                request = None
                continue
            if finished:
                if held.tokens:
                    yield held.take()
                yield done
                return
    except EngineResumeTimeoutError:
        call.infra.failed()
        raise
    finally:
        if request is not None and result is None:  # abandoned mid-generation: free the engine's slot
            await call.router.pick(call.episode_id).abort([request.request_id])
