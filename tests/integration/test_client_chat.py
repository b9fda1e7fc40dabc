"""Chat episodes through the real engine: tool calls, token-exact multi-turn prompts, bad input."""

from __future__ import annotations

import json

import pytest

from fullasync.client import ClientConfig, RolloutService
from fullasync.errors import InvalidRequestError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


def spelled(tokenizer, ids) -> str:
    """The text of a token sequence. The model may end a turn on either stop id (<|im_end|> or
    <|endoftext|>); a sampled <|endoftext|> stays in the sequence and the template's <|im_end|>
    follows it, so it is dropped here to compare with the template's rendering."""
    text = tokenizer.decode(list(ids)).replace("<|endoftext|><|im_end|>", "<|im_end|>")
    return text[: -len("<|endoftext|>")] + "<|im_end|>" if text.endswith("<|endoftext|>") else text


def tool_call_regex(a: int, b: int) -> str:
    """Constrain the untrained tiny model to emit this tool call in the template's own format."""
    body = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
    return "<tool_call>\n" + body.replace("{", r"\{").replace("}", r"\}") + "\n</tool_call>"


async def test_three_turn_tool_episode_is_one_token_exact_sequence(engine, tokenizer):
    client = RolloutService([engine], tokenizer).client()
    messages = [{"role": "user", "content": "What is (3 + 4) + 5? Use the add tool."}]
    for a, b, result in [(3, 4, 7), (7, 5, 12)]:
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=60, temperature=1.0,
            extra_body={"structured_outputs": {"regex": tool_call_regex(a, b)}},
        )
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": a, "b": b}
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    final = await client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, max_tokens=30,
        extra_body={"structured_outputs": {"regex": "The answer is 12\\."}},
    )
    assert final.choices[0].message.content == "The answer is 12."
    assert final.choices[0].finish_reason == "stop"
    messages.append({"role": "assistant", "content": final.choices[0].message.content})

    calls = client.episode.calls
    assert len(calls) == 3
    for earlier, later in zip(calls, calls[1:]):
        assert later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids  # prefix-consistent across turns
    (sequence,) = client.trajectory(reward=1.0).to_sequences()
    assert list(sequence.token_ids) == list(calls[-1].all_ids)
    sampled = [i for i, m in enumerate(sequence.loss_mask) if m]
    expected = []
    for call in calls:
        start = len(call.prompt_ids)
        expected += list(range(start, start + len(call.output_ids)))
    assert sampled == expected
    assert [sequence.logprobs[i] for i in sampled] == [lp for c in calls for lp in c.output_logprobs]
    # the token sequence spells exactly the conversation the template renders
    rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert spelled(tokenizer, sequence.token_ids) == rendered.rstrip("\n")


async def test_return_token_ids_and_logprobs(engine, tokenizer):
    client = RolloutService([engine], tokenizer).client()
    response = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=8, n=2,
        logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True},
    )
    assert len(response.choices) == 2 and len(client.episode.calls) == 2
    for choice, call in zip(response.choices, client.episode.calls):
        assert choice.token_ids == list(call.output_ids)
        assert [t.logprob for t in choice.logprobs.content] == list(call.output_logprobs)
        assert all(len(t.top_logprobs) >= 1 for t in choice.logprobs.content)
    assert response.prompt_token_ids == list(client.episode.calls[0].prompt_ids)


BAD_REQUESTS = [
    ({"model": "gpt-4"}, "unknown model 'gpt-4'"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"max_tokens": -5}, "max_tokens must be a positive integer"),
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role must be one of"),
    ({"messages": [{"role": "user"}]}, "messages[0] (user) needs a string content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text is supported"),
    ({"tools": [{"type": "function"}]}, "tools[0] must look like"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"messages": [{"role": "user", "content": "x " * 3000}]},
     f"maximum context length is {ClientConfig().max_model_len}"),
    ({"frequency_penalty": 1.0}, "frequency_penalty=1.0 is not supported"),
    ({"extra_body": {"guided_json": {}}}, "unsupported extra_body key(s) ['guided_json']"),
]


@pytest.mark.parametrize("override, message", BAD_REQUESTS)
async def test_bad_input_is_rejected_with_a_clear_message_and_not_recorded(engine, tokenizer, override, message):
    client = RolloutService([engine], tokenizer, ClientConfig()).client()
    request = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **override}
    with pytest.raises(InvalidRequestError) as error:
        await client.chat.completions.create(**request)
    assert message in str(error.value)
    assert client.episode.calls == [] and client.episode.turns == []


async def test_completions_prompt_as_text_or_ids(engine, tokenizer):
    client = RolloutService([engine], tokenizer).client()
    first = await client.completions.create(model="policy", prompt="1 + 1 =", max_tokens=5, logprobs=1)
    assert len(first.choices[0].logprobs.token_logprobs) == len(client.episode.calls[0].output_ids)
    ids = list(client.episode.calls[0].all_ids)
    await client.completions.create(model="policy", prompt=ids, max_tokens=3)
    assert client.episode.calls[1].prompt_ids == tuple(ids)
    with pytest.raises(InvalidRequestError, match="prompt must be a non-empty string"):
        await client.completions.create(model="policy", prompt=["a", "b"], max_tokens=3)


class _ShortTokenizer:
    """The tiny tokenizer with its last ids missing, as a padded embedding leaves the tokenizer behind the model
    (Qwen2.5: 151,936 embedding rows, 151,665 tokens); `name_or_path` is its model directory ("" = none known)."""

    def __init__(self, tokenizer, length: int, name_or_path: str) -> None:
        self._tokenizer, self._length, self.name_or_path = tokenizer, length, name_or_path

    def __len__(self) -> int:
        return self._length

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


async def test_ids_the_model_can_sample_beyond_the_tokenizer_are_accepted_back(engine, tokenizer, tiny_model_path):
    from fullasync.client.chat_tokens import model_vocab_size

    rows = model_vocab_size(tiny_model_path)
    unplaced = _ShortTokenizer(tokenizer, len(tokenizer) - 24, "")
    prompt = [10, 11, len(unplaced) + 3]  # an id in the embedding's padding, e.g. sampled on an earlier turn
    with pytest.raises(InvalidRequestError, match=f"outside the vocabulary .*\\[0, {len(unplaced)}\\)"):
        await RolloutService([engine], unplaced).client().completions.create(model="policy", prompt=prompt,
                                                                               max_tokens=2)
    for padded in (RolloutService([engine], unplaced, ClientConfig(vocab_size=rows)),  # told
                   RolloutService([engine], _ShortTokenizer(tokenizer, len(unplaced), tiny_model_path))):  # read
        assert padded.vocab_size == rows
        response = await padded.client().completions.create(model="policy", prompt=prompt, max_tokens=2)
        assert response.usage.prompt_tokens == 3 and response.usage.completion_tokens >= 1
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            await padded.client().completions.create(model="policy", prompt=[rows], max_tokens=2)
