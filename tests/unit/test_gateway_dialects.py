"""The Responses API and Anthropic Messages through the gateway, with the real `openai` and `anthropic` SDKs.

Real client, gateway, template (SmolLM2 + chatml-tools) and tool parser; only the engine is the edge fake that
"samples" scripted tokens (a tool call in the template's format, then an answer). Each dialect's multi-turn tool
episode must be recorded token-exactly as one sequence (every answer received recorded, the prior turns' tokens
reused, not re-tokenized), streamed and not; hostile bodies get that dialect's error shape, never a 404 or 500."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from openai import AsyncOpenAI
from scripted_engine import ScriptedEngine, assert_one_exact_sequence, chat_tokenizer, scripted_gateway
from scripted_engine import script_texts as script

from fullasync.client import ClientConfig, RolloutService
from fullasync.gateway import Gateway

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
ANSWER = "The answer is 7."
FUNCTION = {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


@pytest.fixture
async def served(tokenizer):
    async with scripted_gateway(tokenizer, max_model_len=4096) as (gateway, engine):
        yield gateway, engine, tokenizer


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_responses_tool_episode_is_recorded_token_exactly(served, stream):
    gateway, engine, tokenizer = served
    script(engine, tokenizer, CALL, ANSWER)
    episode = gateway.open_episode()
    sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)
    tools = [{"type": "function", **FUNCTION}]
    history: list = [{"role": "user", "content": "What is 3 + 4? Use the add tool."}]
    kwargs = dict(model="policy", instructions="You add.", tools=tools, max_output_tokens=60, store=False,
                  include=["reasoning.encrypted_content"], prompt_cache_key="k", parallel_tool_calls=True)
    if stream:
        events = [event async for event in await sdk.responses.create(input=history, stream=True, **kwargs)]
        kinds = [event.type for event in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        output = events[-1].response.output
    else:
        output = (await sdk.responses.create(input=history, **kwargs)).output
    (call,) = [item for item in output if item.type == "function_call"]
    assert call.name == "add" and json.loads(call.arguments) == {"a": 3, "b": 4}
    history += [item.model_dump(exclude_none=True) for item in output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "7"})
    final = await sdk.responses.create(input=history, **kwargs)
    assert final.output_text == ANSWER and final.status == "completed"
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    gateway.close_episode(episode)
    assert_one_exact_sequence(episode.client, calls=2)


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_tool_episode_is_recorded_token_exactly(served, stream):
    gateway, engine, tokenizer = served
    script(engine, tokenizer, CALL, ANSWER)
    episode = gateway.open_episode()
    sdk = anthropic.AsyncAnthropic(base_url=episode.base_url.removesuffix("/v1"), api_key=episode.api_key,
                                   max_retries=0)
    tools = [{"name": "add", "description": FUNCTION["description"], "input_schema": FUNCTION["parameters"],
              "cache_control": {"type": "ephemeral"}}]
    messages: list = [{"role": "user", "content": [{"type": "text", "text": "What is 3 + 4? Use the add tool."}]}]
    kwargs = dict(model="policy", max_tokens=60, system=[{"type": "text", "text": "You add."}], tools=tools,
                  metadata={"user_id": "u"}, extra_body={"thinking": {"type": "adaptive"}})
    if stream:
        async with sdk.messages.stream(messages=messages, **kwargs) as events:
            first = await events.get_final_message()
    else:
        first = await sdk.messages.create(messages=messages, **kwargs)
    assert first.stop_reason == "tool_use"
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "add" and use.input == {"a": 3, "b": 4}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "7"}]}]
    counted = await sdk.messages.count_tokens(model="policy", messages=messages, tools=tools, system=kwargs["system"])
    final = await sdk.messages.create(messages=messages, **kwargs)
    assert final.stop_reason == "end_turn" and final.content[0].text == ANSWER
    assert final.usage.input_tokens == counted.input_tokens
    gateway.close_episode(episode)
    assert_one_exact_sequence(episode.client, calls=2)


async def test_a_stop_sequence_is_reported_as_anthropic_does(served):
    gateway, engine, tokenizer = served
    engine.script.append((tokenizer.encode("Thought: add them. Observation:", add_special_tokens=False),
                          "Observation:"))
    episode = gateway.open_episode()
    sdk = anthropic.AsyncAnthropic(base_url=episode.base_url.removesuffix("/v1"), api_key="k", max_retries=0)
    message = await sdk.messages.create(model="policy", max_tokens=40, stop_sequences=["Observation:"],
                                        messages=[{"role": "user", "content": "go"}])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "Observation:"
    assert message.content[0].text == "Thought: add them. "
    gateway.close_episode(episode)


HOSTILE = [
    ("responses", b"not json", 400), ("responses", b"[1, 2]", 400), ("responses", b'{"model": "policy"}', 400),
    ("responses", b'{"model": "policy", "input": 5}', 400),
    ("responses", b'{"model": "policy", "input": [{"type": "image_generation_call"}]}', 400),
    ("responses", b'{"model": "policy", "input": "hi", "previous_response_id": "resp_1"}', 400),
    ("responses", b'{"model": "policy", "input": "hi", "store": true}', 400),
    ("responses", b'{"model": "policy", "input": "hi", "bogus": 1}', 400),
    ("responses", b'{"model": "policy", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}', 400),
    ("responses", b'{"model": "policy", "input": "hi", "tools": [{"type": "computer_use_preview"}]}', 400),
    ("responses", b'{"model": "other", "input": "hi"}', 400),
    ("responses", b'{"model": "policy", "input": "hi", "max_output_tokens": "x"}', 400),
    ("messages", b"{", 400), ("messages", b'{"model": "policy", "messages": []}', 400),
    ("messages", b'{"model": "policy", "max_tokens": 5, "messages": "hi"}', 400),
    ("messages", b'{"model": "policy", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}', 400),
    ("messages", b'{"model": "policy", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": '
                 b'"image"}]}]}', 400),
    ("messages", b'{"model": "policy", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], '
                 b'"mcp_servers": []}', 400),
    ("messages", b'{"model": "policy", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], '
                 b'"tools": [{"name": "t", "input_schema": 3}]}', 400),
    ("messages", b'{"model": "policy", "max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": '
                 b'"tool_use", "id": "x", "name": "t", "input": [1]}]}]}', 400),
    ("messages", b'{"model": "policy", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], '
                 b'"unknown_field": true}', 400),
    ("messages/count_tokens", b'{"model": "policy", "messages": 1}', 400),
    ("messages", b'{"model": {"include_usage": true}, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}',
     400),
    ("responses", b'{"model": ["policy"], "input": "hi"}', 400),
]


async def test_hostile_bodies_get_the_dialects_own_error_shape(served):
    gateway, engine, _ = served
    episode = gateway.open_episode()
    async with httpx.AsyncClient(base_url=episode.base_url) as http:
        for route, body, status in HOSTILE:
            answer = await http.post(f"/{route}", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == status, (route, body, answer.text)
            error = answer.json()
            if route.startswith("messages"):
                assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
                assert error["error"]["message"]
            else:
                assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"], error
        big = await http.post("/messages", content=b'{"x": "' + b"a" * (gateway.max_body_bytes + 1) + b'"}')
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
        gone = await http.post(episode.base_url.replace(episode.api_key, "nope") + "/messages", content=b"{}")
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
    assert engine.script == [] and episode.client.episode.calls == []  # nothing generated, nothing recorded
    gateway.close_episode(episode)


async def test_a_background_model_is_answered_and_counted_but_not_recorded(tokenizer):
    engine = ScriptedEngine()
    service = RolloutService([engine], tokenizer, ClientConfig(model_name="policy", max_model_len=4096))
    gateway = Gateway(service, untrained_models=("background",))
    await gateway.start()
    try:
        script(engine, tokenizer, "A title", ANSWER)
        episode = gateway.open_episode()
        sdk = anthropic.AsyncAnthropic(base_url=episode.base_url.removesuffix("/v1"), api_key="k", max_retries=0)
        title = await sdk.messages.create(model="background", max_tokens=10, messages=[{"role": "user",
                                                                                      "content": "title?"}])
        answer = await sdk.messages.create(model="policy", max_tokens=10, messages=[{"role": "user",
                                                                                   "content": "go"}])
        assert title.content[0].text == "A title" and answer.content[0].text == ANSWER
        with pytest.raises(anthropic.BadRequestError, match="unknown model"):
            await sdk.messages.create(model="typo", max_tokens=10, messages=[{"role": "user", "content": "go"}])
        gateway.close_episode(episode)
        (call,) = episode.client.episode.calls
        assert tokenizer.decode(call.output_ids, skip_special_tokens=True) == ANSWER
        assert gateway.stats()["gateway/untrained_calls"] == 1
        assert sum(service.router._bound.values()) == 0  # the background call's episode was released
    finally:
        await gateway.stop()


def test_a_prior_turns_handle_restores_the_exact_reasoning_the_policy_wrote(tokenizer):
    """Codex sends a reasoning item back with only its `encrypted_content`, Claude Code a thinking block with its
    `signature`: the handle the gateway issued gives back the reasoning text as generated; a foreign one is read as
    the text it carries."""
    from fullasync.client.dialects import anthropic_messages, openai_responses

    client = RolloutService([ScriptedEngine()], tokenizer, ClientConfig(model_name="policy")).client()
    handle = client.handles.issue("  the exact\nthinking ")
    responses = openai_responses.translate(client, {"model": "policy", "input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": handle},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "theirs"}],
         "encrypted_content": "not ours"}]})
    assert responses.chat["messages"][1] == {"role": "assistant", "content": None, "reasoning_content":
                                             "  the exact\nthinking ", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}
    assert responses.chat["messages"][-1]["reasoning_content"] == "theirs"
    chat, _ = anthropic_messages.translate(client, {"model": "policy", "max_tokens": 5, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": handle},
                                          {"type": "text", "text": "a"}]}]})
    assert chat["messages"][1] == {"role": "assistant", "content": "a", "reasoning_content": "  the exact\nthinking "}
