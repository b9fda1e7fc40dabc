"""Prompt ids for multi-turn chat: exact reuse of earlier ids, tool-call parsing, validation."""

from __future__ import annotations

import pytest

from fullasync.client.chat_tokens import ChatTokenizer, TurnState
from fullasync.client.messages import normalize_messages, normalize_tools
from fullasync.client.request_schema import parse_chat
from fullasync.client.tool_parsers import (
    HermesToolParser,
    constrained_calls,
    constrained_choice,
    make_tool_parser,
    tool_choice_schema,
)
from fullasync.errors import InvalidRequestError


def test_continuation_appends_only_the_inserted_text(tokenizer):
    chat = ChatTokenizer(tokenizer)
    history = [{"role": "user", "content": "What is 2 + 2?"}]
    prompt = chat.prompt_ids(history, None)
    # an output whose tokens differ from how its text would re-tokenize: one token per character
    output = [tokenizer.convert_tokens_to_ids(c) for c in "four"] + [chat.eos_token_id]
    assert output[:-1] != chat.encode("four")
    turn = TurnState(tuple(history) + ({"role": "assistant", "content": "four"},), None, tuple(prompt + output), True)
    glue = chat.continuation_ids(turn, [{"role": "user", "content": "And 3 + 3?"}])
    ids = list(turn.token_ids) + glue
    assert ids[: len(turn.token_ids)] == list(turn.token_ids)  # earlier ids kept exactly
    assert tokenizer.decode(glue) == "\n<|im_start|>user\nAnd 3 + 3?<|im_end|>\n<|im_start|>assistant\n"
    full = history + [{"role": "assistant", "content": "four"}, {"role": "user", "content": "And 3 + 3?"}]
    assert tokenizer.decode(ids) == chat.render(full, None, generation_prompt=True)


def test_continuation_closes_a_turn_that_ended_without_eos(tokenizer):
    chat = ChatTokenizer(tokenizer)
    history = [{"role": "user", "content": "hi"}]
    output = chat.encode("hello th")  # cut by max_tokens: no EOS sampled
    turn = TurnState(tuple(history) + ({"role": "assistant", "content": "hello th"},), None,
                     tuple(chat.prompt_ids(history, None) + output), False)
    glue = chat.continuation_ids(turn, [{"role": "user", "content": "go on"}])
    assert tokenizer.decode(glue).startswith("<|im_end|>\n<|im_start|>user\ngo on")


def test_hermes_parser_splits_content_and_calls():
    parser = make_tool_parser("hermes")
    content, calls = parser.parse('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    assert content == "Let me add." and [(c.name, c.arguments) for c in calls] == [("add", {"a": 1})]
    content, calls = HermesToolParser().parse("<tool_call>{not json}</tool_call>")
    assert calls == [] and content == "<tool_call>{not json}</tool_call>"
    with pytest.raises(ValueError, match="tool parser 'xml' is vLLM's and needs the model's tokenizer"):
        make_tool_parser("xml")  # any name but ours is looked up in vLLM's registry (tests/unit/test_formats.py)


def test_a_constraining_tool_choice_names_one_of_the_tools_and_reads_its_calls_from_json():
    tools = normalize_tools([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])

    def choice(tool_choice: object) -> object:
        request = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools,
                              "tool_choice": tool_choice}).request
        return constrained_choice(request.tool_choice, tools)

    assert [choice(given) for given in ("auto", "none", None)] == [None, None, None]
    assert choice("required") == "required"
    named = choice({"type": "function", "function": {"name": "add"}})
    assert named == {"type": "function", "function": {"name": "add"}}
    assert tool_choice_schema(named, tools) == {"type": "object"}
    assert [(c.name, c.arguments) for c in constrained_calls('{"a": 1}', named)] == [("add", {"a": 1})]
    calls = constrained_calls('[{"name": "add", "parameters": {"a": 2}}]', "required")
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 2})]
    assert constrained_calls('[{"name": "add", "param', "required") == []  # cut by length: stays content
    with pytest.raises(InvalidRequestError, match="names the function 'mul', which is not among the request's tools"):
        choice({"type": "function", "function": {"name": "mul"}})


def test_messages_from_openai_objects_and_string_arguments_normalize_alike():
    from openai.types.chat import ChatCompletionMessage

    message = ChatCompletionMessage(
        role="assistant", content=None,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
    )
    (normalized,) = normalize_messages([message])
    assert normalized["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    with pytest.raises(InvalidRequestError, match="arguments is not valid JSON"):
        normalize_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}])
    with pytest.raises(InvalidRequestError, match="only assistant messages carry tool_calls"):
        normalize_messages([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}])
    assert normalize_tools(None) is None
    with pytest.raises(InvalidRequestError, match="tools must be a list"):
        normalize_tools("add")
