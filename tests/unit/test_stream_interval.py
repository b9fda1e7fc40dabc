"""The stream interval (`rollout.stream_interval`, vLLM's `--stream-interval`): `stream_with_resume` sends the
first delta at once, later tokens once `interval` of them are there, the rest before the whole; held tokens cross a
weight push's resubmission, and held tokens of an engine that died are generated again, never sent twice."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from fullasync.client.continuation import ResumableCall, StitchedGeneration, stream_with_resume
from fullasync.contracts.engine import GenerateRequest, GenerateResult, SamplingOptions, TokenDelta
from fullasync.errors import EngineDiedError
from fullasync.types import FinishReason

DIES = "dies"  # a segment script's last item: the engine dies there instead of answering


class ScriptedSegments:
    """A router whose every engine request plays the next script: one-token deltas of the given ids, then a result
    (`finish`), or an engine death."""

    name = "scripted"

    def __init__(self, scripts: Sequence[tuple[Sequence[int], FinishReason | str]]) -> None:
        self.scripts = list(scripts)
        self.requests: list[GenerateRequest] = []

    def bound(self, episode_id: str) -> bool:
        return True

    async def admit(self, episode_id: str, prompt_tokens: int, max_tokens: int = 0) -> ScriptedSegments:
        return self  # one engine, room for all

    def settle(self, episode_id: str, prompt_tokens: int, answer_tokens: int) -> None:
        pass

    async def generate_stream(self, request: GenerateRequest, episode_id: str
                              ) -> AsyncIterator[TokenDelta | GenerateResult]:
        self.requests.append(request)
        ids, finish = self.scripts.pop(0)
        for token in ids:
            yield TokenDelta((token,), (-token / 100,))
        if finish == DIES:
            raise EngineDiedError("engine scripted died")
        yield GenerateResult(request.request_id, tuple(ids), tuple(-t / 100 for t in ids), (len(self.requests),) *
                             len(ids), finish)

    def pick(self, episode_id: str) -> ScriptedSegments:
        return self

    async def wait_resumed(self, timeout_s: float) -> bool:
        return True

    async def wait_alive(self, timeout_s: float) -> bool:
        return True

    async def abort(self, request_ids: list[str]) -> None:
        raise AssertionError(f"nothing is abandoned here ({request_ids})")


async def streamed(router: ScriptedSegments, interval: int, max_tokens: int = 100
                   ) -> tuple[list[tuple[int, ...]], StitchedGeneration]:
    deltas, whole = [], None
    call = ResumableCall(router, "episode", "call", [1, 2], max_tokens, SamplingOptions(), resume_timeout_s=1.0,
                         restart_wait_s=1.0)
    async for item in stream_with_resume(call, interval=interval):
        if isinstance(item, StitchedGeneration):
            whole = item
        else:
            assert len(item.output_logprobs) == len(item.output_ids)
            assert list(item.output_logprobs) == [-t / 100 for t in item.output_ids]  # aligned through merging
            deltas.append(item.output_ids)
    assert whole is not None
    return deltas, whole


async def test_first_delta_at_once_then_interval_sized_chunks_then_the_rest():
    router = ScriptedSegments([(range(10, 20), FinishReason.STOP)])
    deltas, whole = await streamed(router, interval=4)
    assert [len(d) for d in deltas] == [1, 4, 4, 1]
    assert [t for d in deltas for t in d] == whole.output_ids == list(range(10, 20))


async def test_interval_one_sends_every_delta():
    deltas, _ = await streamed(ScriptedSegments([(range(10, 15), FinishReason.STOP)]), interval=1)
    assert deltas == [(t,) for t in range(10, 15)]


async def test_held_tokens_cross_a_resubmission_after_a_push():
    router = ScriptedSegments([((10, 11, 12), FinishReason.ABORT), ((13, 14, 15, 16), FinishReason.STOP)])
    deltas, whole = await streamed(router, interval=4)
    assert [len(d) for d in deltas] == [1, 4, 2]  # 11, 12 (interrupted segment) and 13, 14 in one chunk
    assert [t for d in deltas for t in d] == whole.output_ids == list(range(10, 17))
    assert router.requests[1].prompt_ids == (1, 2, 10, 11, 12) and whole.num_resumes == 1


async def test_held_tokens_of_a_dead_engine_are_generated_again_and_sent_once():
    router = ScriptedSegments([((10,), FinishReason.ABORT), ((11, 12), DIES), ((21, 22, 23), FinishReason.STOP)])
    deltas, whole = await streamed(router, interval=8)
    assert deltas == [(10,), (21, 22, 23)]  # 11 and 12 were held when their engine died: never sent
    assert whole.output_ids == [10, 21, 22, 23]
    assert router.requests[2].prompt_ids == (1, 2, 10)  # resubmitted after what was absorbed, not after 11, 12
