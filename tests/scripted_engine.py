"""An edge fake for tests of the client: an engine that "samples" what the test scripted.

Each request is answered with the next scripted output ids (ended by STOP, or cut by `max_tokens` as LENGTH); a
script entry `(ids, stop_string)` ends as vLLM ends an output at a stop string of the request (STOP, the string as
its `stop_reason`, the ids through the string's tokens);
streams deliver them a few ids at a time, so a delta may end inside a marker or a multi-byte character.
`push_after(call, tokens)` makes a weight push happen there: that call's generation is interrupted (ABORT) after
`tokens` ids, the version goes up, and the client's resubmission gets the rest of the same scripted output under the
new version, as vLLM's engine continues an aborted request resubmitted with its tokens. Everything between the test
and this engine (client, gateway, parsers, templates) stays real."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fullasync.contracts.engine import GenerateRequest, GenerateResult, Mortal, TokenDelta
from fullasync.types import FinishReason


def chat_tokenizer():
    """SmolLM2's tokenizer with the chatml-tools template: prompts as a real chat template renders them."""
    from fullasync.models import build_pretrained_model, load_tokenizer, with_chat_template

    return load_tokenizer(with_chat_template(build_pretrained_model("smollm2-135m-instruct"), "chatml-tools"))


@contextlib.asynccontextmanager
async def scripted_gateway(tokenizer, max_model_len: int, engine: ScriptedEngine | None = None):
    """A started gateway in front of one `ScriptedEngine` (`engine`, else a new one; model name `policy`): yields
    (gateway, engine)."""
    from fullasync.client import ClientConfig, RolloutService
    from fullasync.gateway import Gateway

    engine = engine if engine is not None else ScriptedEngine()
    config = ClientConfig(model_name="policy", max_model_len=max_model_len)
    gateway = Gateway(RolloutService([engine], tokenizer, config))
    await gateway.start()
    try:
        yield gateway, engine
    finally:
        await gateway.stop()


class ScriptedEngine(Mortal):
    name = "scripted"
    workers = 1
    kv_tokens = None  # unknown: the router counts bound episodes

    def __init__(self) -> None:
        self.script: list[list[int] | tuple[list[int], str]] = []
        self.weight_version = 0
        self.pushes: dict[int, int] = {}  # the call (0-based, counted by fresh requests) -> tokens before its push
        self.calls = 0
        self.requests: list[GenerateRequest] = []  # every request it was sent, resubmissions included

    def push_after(self, call: int, tokens: int) -> None:
        self.pushes[call] = tokens

    async def wait_resumed(self, timeout_s: float) -> bool:
        return True

    async def kv_stats(self) -> None:
        return None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        entry = self.script.pop(0)
        ids, stop = (entry, None) if isinstance(entry, list) else entry
        if (cut := self.pushes.pop(self.calls, None)) is not None and cut < len(ids):
            self.script.insert(0, (ids[cut:], stop) if stop else ids[cut:])  # the rest, for the resubmission
            self.weight_version += 1
            return GenerateResult(request.request_id, tuple(ids[:cut]), (-0.5,) * cut,
                                  (self.weight_version - 1,) * cut, FinishReason.ABORT, engine=self.name)
        self.calls += 1
        assert stop is None or stop in request.sampling.stop, f"the script stops at {stop!r}, not asked to"
        ids = ids[: request.max_tokens]
        finish = FinishReason.STOP if len(ids) < request.max_tokens or stop else FinishReason.LENGTH
        return GenerateResult(request.request_id, tuple(ids), (-0.5,) * len(ids), (self.weight_version,) * len(ids),
                              finish, stop_reason=stop, engine=self.name)

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        result = await self.generate(request)
        for start in range(0, len(result.output_ids), 3):
            yield TokenDelta(result.output_ids[start : start + 3], result.output_logprobs[start : start + 3])
        yield result

    async def abort(self, request_ids: list[str]) -> None:
        raise AssertionError(f"a scripted engine is never interrupted ({request_ids})")


def script_texts(engine: ScriptedEngine, tokenizer, *texts: str) -> None:
    """Script each text, tokenized in isolation and ended by EOS, as the engine's next outputs."""
    for text in texts:
        engine.script.append(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])


def assert_one_exact_sequence(client, calls: int) -> None:
    """The episode recorded `calls` calls, each prompt extending the one before token for token (the sampled ids
    reused, never re-tokenized), so that they train as one sequence whose loss-masked tokens are the outputs."""
    recorded = client.trajectory(reward=1.0)
    assert len(recorded.calls) == calls
    for earlier, later in zip(recorded.calls, recorded.calls[1:]):
        assert later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids
    (sequence,) = recorded.to_sequences()
    assert [t for t, m in zip(sequence.token_ids, sequence.loss_mask) if m] == [
        t for call in recorded.calls for t in call.output_ids]
