"""An edge fake for tests of the client: an engine that "samples" what the test scripted.

Each request is answered with the next scripted output ids (ended by STOP, or cut by `max_tokens` as LENGTH);
streams deliver them a few ids at a time, so a delta may end inside a marker or a multi-byte character. Everything
between the test and this engine (client, gateway, parsers, templates) stays real."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fullasync.contracts.engine import GenerateRequest, GenerateResult, TokenDelta
from fullasync.types import FinishReason


class ScriptedEngine:
    name = "scripted"
    death = None
    workers = 1

    def __init__(self) -> None:
        self.script: list[list[int]] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        ids = self.script.pop(0)[: request.max_tokens]
        finish = FinishReason.STOP if len(ids) < request.max_tokens else FinishReason.LENGTH
        return GenerateResult(request.request_id, tuple(ids), (-0.5,) * len(ids), (0,) * len(ids), finish,
                              engine=self.name)

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        result = await self.generate(request)
        for start in range(0, len(result.output_ids), 3):
            yield TokenDelta(result.output_ids[start : start + 3], result.output_logprobs[start : start + 3])
        yield result

    async def abort(self, request_ids: list[str]) -> None:
        raise AssertionError(f"a scripted engine is never interrupted ({request_ids})")
