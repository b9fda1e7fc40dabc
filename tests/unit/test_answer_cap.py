"""`rollout.max_answer_tokens`: every answer's cap, whatever the harness asks for (Claude Code asks 32,000 tokens,
Codex asks none). Real client and template; the engine is the edge fake, which reports what it was asked."""

from __future__ import annotations

import pytest
from scripted_engine import ScriptedEngine, chat_tokenizer, script_texts

from fullasync.client import ClientConfig, RolloutService

LONG = "one two three four five six seven eight nine ten eleven twelve"


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


@pytest.mark.parametrize(("asked", "cap", "sent"), [(None, 6, 6), (32000, 6, 6), (3, 6, 3), (None, 0, None)])
async def test_an_answer_ends_at_the_cap_whatever_max_tokens_asks(tokenizer, asked, cap, sent):
    """A max_tokens over the context is lowered to the cap before the context is checked (Claude Code's 32,000 in a
    512-token context); `sent` None: without a cap or max_tokens the context's rest bounds the answer."""
    engine = ScriptedEngine()
    script_texts(engine, tokenizer, LONG)
    client = RolloutService([engine], tokenizer, ClientConfig(max_model_len=512, max_answer_tokens=cap)).client()
    messages = [{"role": "user", "content": "Count."}]
    answer = await client.chat.completions.create(model="policy", messages=messages,
                                                  **({} if asked is None else {"max_tokens": asked}))
    (request,) = engine.requests
    assert request.max_tokens == (512 - len(request.prompt_ids) if sent is None else sent)
    (call,) = client.episode.calls
    assert len(call.output_ids) == min(request.max_tokens, len(tokenizer.encode(LONG, add_special_tokens=False)) + 1)
    assert answer.choices[0].finish_reason == ("stop" if sent is None else "length")
