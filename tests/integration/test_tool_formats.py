"""Token-exactness per chat format, through the gateway with the openai SDK (formats: `tool_formats.py`).

For each format, random multi-turn tool conversations (≥ 100) go through the real gateway and client; only the
engine is an edge fake that "samples" scripted tokens: the format's own text for a random assistant message (its
canonical tokenization, or split at random points), ended by EOS. Some turns stream. Each answer must come back as
the message that was sampled (content, reasoning, calls with their arguments), and each episode's training sequence
must spell the template's rendering of the final conversation with loss mask 1 exactly on the sampled tokens — zero
drift — while a naive re-tokenization of the same rendering is counted beside it.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from openai import AsyncOpenAI
from scripted_engine import ScriptedEngine
from tool_formats import FORMATS, ChatFormat, format_tokenizer

from fullasync.client import ClientConfig, RolloutService
from fullasync.client.messages import normalize_messages
from fullasync.client.reasoning import ReasoningSplitter
from fullasync.client.tool_parsers import make_tool_parser
from fullasync.contracts.engine import GenerateRequest, GenerateResult
from fullasync.errors import InvalidRequestError
from fullasync.gateway import Gateway
from fullasync.models import check_chat_setup

CONVERSATIONS = 100
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Search the notes.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}},
]
FRAGMENTS = ("hello", "world", "The answer is", "42", "3.14", "café", "naïve", "日本語", "数学", "Привет", "🙂", "→",
             "≤", "x=1;", "a\tb", "end.", "'quoted'", "\"double\"", "C:\\path", "#", "100%", "sum", "(3 + 4)")


def random_text(rng: random.Random) -> str:
    words = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 6))]
    return "".join(w + rng.choice((" ", " ", ", ", "\n", "")) for w in words).strip()


def random_reply(rng: random.Random, chat_format: ChatFormat, tools: bool, thinking: bool) -> dict:
    reply: dict = {"role": "assistant", "content": random_text(rng)}
    if tools and rng.random() < 0.6:
        calls = []
        for index in range(rng.choice((1, 1, 2))):
            if rng.random() < 0.5:
                name, arguments = "add", {"a": rng.randint(-50, 999), "b": rng.randint(0, 9)}
            else:
                name, arguments = "search", {"query": random_text(rng)}
            calls.append({"id": f"call-{index}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        reply["tool_calls"] = calls
        if not chat_format.content_with_calls or rng.random() < 0.5:
            reply["content"] = None
    if thinking:
        reply["reasoning_content"] = random_text(rng) if rng.random() < 0.9 else ""
    return reply


def sampled_ids(rng: random.Random, chat, history: list[dict], reply: dict, tools, kwargs,
                markers: tuple[str, ...]) -> list[int]:
    """Token ids a model could have sampled for `reply`: the template's text for it, tokenized canonically or in
    pieces cut at random points (never inside one of the format's marker tokens)."""
    before = chat.render(normalize_messages(history), tools, True, kwargs)
    with_reply = chat.render(normalize_messages(history + [reply]), tools, False, kwargs)
    assert with_reply.startswith(before), "the format's template is not prefix-stable"
    text = with_reply[len(before) : with_reply.rindex(chat.eos_text)]
    inside = {i for marker in markers for m in re.finditer(re.escape(marker), text)
              for i in range(m.start() + 1, m.end())}
    allowed = [i for i in range(1, len(text)) if i not in inside]
    if rng.random() < 0.6 or not allowed:
        return chat.encode(text)
    cuts = sorted(rng.sample(allowed, k=min(len(allowed), rng.randint(1, 4))))
    return [i for a, b in zip([0, *cuts], [*cuts, len(text)]) for i in chat.encode(text[a:b])]


async def ask(sdk: AsyncOpenAI, stream: bool, **kwargs) -> dict:
    """The assistant message as the harness receives it, streamed (deltas joined) or not."""
    if not stream:
        message = (await sdk.chat.completions.create(**kwargs)).choices[0].message
        return message.model_dump(exclude_none=True)
    content, reasoning, calls = "", "", {}
    async for chunk in await sdk.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
    message: dict = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def same_answer(got: dict, sent: dict) -> bool:
    """The harness received the message that was sampled: text (up to the whitespace a format trims around its
    markers), thinking, and every call's name and arguments."""
    if (got.get("content") or "").strip() != (sent.get("content") or "").strip():
        return False
    if (got.get("reasoning_content") or "").strip("\n") != (sent.get("reasoning_content") or ""):
        return False
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got.get("tool_calls") or []]
    return calls == [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in sent.get("tool_calls") or []]


async def run_conversation(rng: random.Random, gateway, engine, chat_format: ChatFormat, counts: dict) -> list[str]:
    service = gateway.service
    chat = service.chat_tokens
    markers = chat_format.special_tokens + chat_format.added_tokens + ("<tool_call>", "</tool_call>")
    thinking = bool(chat_format.reasoning_parser) and rng.random() < 0.75
    kwargs = {} if thinking or not chat_format.reasoning_parser else {"enable_thinking": False}
    tools = TOOLS if rng.random() < 0.85 else None
    messages: list[dict] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": random_text(rng)})
    messages.append({"role": "user", "content": random_text(rng)})
    episode = gateway.open_episode()
    sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)
    problems = []
    turns = rng.randint(1, 4)
    for turn in range(turns):
        reply = random_reply(rng, chat_format, tools is not None, thinking)
        ids = sampled_ids(rng, chat, messages, reply, tools, kwargs, markers)
        engine.script.append(ids + [chat.eos_token_id])
        stream = rng.random() < 0.3
        extra = {"chat_template_kwargs": kwargs} if kwargs else {}
        got = await ask(sdk, stream, model="policy", messages=messages, max_tokens=len(ids) + 8,
                        **({"tools": tools} if tools else {}), extra_body=extra or None)
        if not same_answer(got, reply):
            problems.append(f"turn {turn}: sampled {reply}, the harness got {got}")
        counts["streamed_calls"] += stream and bool(got.get("tool_calls"))
        counts["calls"] += bool(got.get("tool_calls"))
        messages.append(got)
        if turn == turns - 1:
            break
        for call in got.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": random_text(rng)})
        if not got.get("tool_calls") or rng.random() < 0.3:
            messages.append({"role": "user", "content": random_text(rng)})
    gateway.close_episode(episode)
    await sdk.close()
    client = episode.client
    sequences = client.trajectory(reward=0.0).to_sequences()
    if len(sequences) != 1:
        return problems + [f"{len(sequences)} training sequences, expected one"]
    (sequence,) = sequences
    ids = list(sequence.token_ids)
    rendered = chat.render(normalize_messages(messages), tools, False, kwargs)
    rendered = rendered[: rendered.rindex(chat.eos_text) + len(chat.eos_text)]
    decoded = chat.tokenizer.decode(ids, skip_special_tokens=False)
    if decoded != rendered:
        problems.append(f"the training sequence does not spell the rendering:\n{decoded!r}\n{rendered!r}")
    mask = [0] * len(ids)
    for call in client.episode.calls:
        start = len(call.prompt_ids)
        if ids[start : start + len(call.output_ids)] != list(call.output_ids):
            problems.append("a call's sampled ids are not where its prompt ends")
        mask[start : start + len(call.output_ids)] = [1] * len(call.output_ids)
    if list(sequence.loss_mask) != mask:
        problems.append("the loss mask is not 1 exactly on the sampled tokens")
    counts["naive_drift"] += chat.encode(rendered) != ids
    return problems


@pytest.mark.parametrize("name", list(FORMATS))
async def test_random_tool_conversations_through_the_gateway_are_token_exact_in_each_format(name, tiny_model_path):
    chat_format = FORMATS[name]
    tokenizer = format_tokenizer(tiny_model_path, chat_format)
    engine = ScriptedEngine()
    service = RolloutService([engine], tokenizer, ClientConfig(
        tool_parser=chat_format.tool_parser, reasoning_parser=chat_format.reasoning_parser, max_model_len=4096))
    check_chat_setup(tokenizer, service.tool_parser, name, service.reasoning)  # the start-up check passes
    gateway = Gateway(service)
    await gateway.start()
    counts = {"streamed_calls": 0, "calls": 0, "naive_drift": 0}
    problems = []
    try:
        for seed in range(CONVERSATIONS):
            problems += [f"seed {seed}: {p}" for p in await run_conversation(random.Random(seed), gateway, engine,
                                                                              chat_format, counts)]
    finally:
        await gateway.stop()
    print(f"\n{name}: {CONVERSATIONS} conversations, {counts['calls']} answers with tool calls "
          f"({counts['streamed_calls']} streamed); naive re-tokenization drifts on {counts['naive_drift']}, ours on "
          f"{sum('spell' in p for p in problems)}")
    assert not problems, "\n".join(problems[:5])
    assert counts["streamed_calls"] > 0 and counts["calls"] > CONVERSATIONS / 4


def scripted_service(tiny_model_path, chat_format: ChatFormat, engine) -> RolloutService:
    tokenizer = format_tokenizer(tiny_model_path, chat_format)
    return RolloutService([engine], tokenizer, ClientConfig(
        tool_parser=chat_format.tool_parser, reasoning_parser=chat_format.reasoning_parser, max_model_len=4096))


class ConstraintRecordingEngine(ScriptedEngine):
    def __init__(self) -> None:
        super().__init__()
        self.constraints: list = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.constraints.append(request.sampling.structured)
        return await super().generate(request)


@pytest.mark.parametrize("name", ["qwen3_coder", "llama3_json"])
async def test_tool_choice_required_and_named_constrain_the_output_to_calls_in_any_format(name, tiny_model_path):
    engine = ConstraintRecordingEngine()
    service = scripted_service(tiny_model_path, FORMATS[name], engine)
    chat = service.chat_tokens
    client = service.client()
    messages = [{"role": "user", "content": "add 2 and 3, then search"}]
    named = {"type": "function", "function": {"name": "add"}}
    engine.script.append(chat.encode('{"a": 2, "b": 3}') + [chat.eos_token_id])
    response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                     tool_choice=named)
    (call,) = response.choices[0].message.tool_calls
    assert response.choices[0].finish_reason == "tool_calls" and response.choices[0].message.content is None
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
    assert engine.constraints[-1] == ("compact_json", TOOLS[0]["function"]["parameters"])
    required = '[{"name": "add", "parameters": {"a": 2, "b": 3}}, {"name": "search", "parameters": {"query": "x"}}]'
    engine.script.append(chat.encode(required) + [chat.eos_token_id])
    response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                     tool_choice="required")
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in response.choices[0].message.tool_calls]
    assert calls == [("add", {"a": 2, "b": 3}), ("search", {"query": "x"})]
    kind, schema = engine.constraints[-1]
    assert kind == "compact_json" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["add"], ["search"]]
    engine.script.append(chat.encode(required[: required.index("}, {") + 1] + "]") + [chat.eos_token_id])
    stream = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                   tool_choice="required", parallel_tool_calls=False, stream=True)
    deltas = [chunk.choices[0].delta async for chunk in stream if chunk.choices]
    assert [d.tool_calls[0].function.name for d in deltas if d.tool_calls] == ["add"]
    assert "".join(d.content or "" for d in deltas) == ""  # the JSON is the call, never content
    assert engine.constraints[-1][1]["maxItems"] == 1
    assert engine.constraints[0] is not None and len(client.episode.calls) == 3
    with pytest.raises(InvalidRequestError, match="names the function 'multiply'"):
        await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                             tool_choice={"type": "function", "function": {"name": "multiply"}})
    with pytest.raises(InvalidRequestError, match="needs tools"):
        await client.chat.completions.create(model="policy", messages=messages, tool_choice="required")
    # the OpenAI Agents SDK's request with an output type: vLLM's rule, the tool constraint wins for this call
    engine.script.append(chat.encode(required) + [chat.eos_token_id])
    output_type = {"type": "json_schema", "json_schema": {"name": "final", "schema": {"type": "object"}}}
    response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                     tool_choice="required", response_format=output_type)
    assert [c.function.name for c in response.choices[0].message.tool_calls] == ["add", "search"]
    assert engine.constraints[-1][0] == "compact_json" and engine.constraints[-1][1]["minItems"] == 1


async def test_chat_template_kwargs_reach_the_template_and_are_part_of_the_recorded_render(tiny_model_path):
    engine = ScriptedEngine()
    service = scripted_service(tiny_model_path, FORMATS["qwen3_think"], engine)
    chat = service.chat_tokens
    client = service.client()
    messages = [{"role": "user", "content": "hi"}]
    engine.script.append(chat.encode("Hello.") + [chat.eos_token_id])
    off = await client.chat.completions.create(model="policy", messages=messages,
                                               extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert chat.tokenizer.decode(client.episode.calls[0].prompt_ids).endswith("<think>\n\n</think>\n\n")
    message = off.choices[0].message
    assert message.content == "Hello." and getattr(message, "reasoning_content", None) is None  # closed: no thinking
    messages += [message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    engine.script.append(chat.encode("<think>\nhm\n</think>\n\nSure.") + [chat.eos_token_id])
    on = await client.chat.completions.create(model="policy", messages=messages)  # kwargs differ: a fresh render
    assert (on.choices[0].message.reasoning_content, on.choices[0].message.content) == ("\nhm\n", "\n\nSure.")
    assert len(client.trajectory(0.0).to_sequences()) == 2
    with pytest.raises(InvalidRequestError, match="may not set \\['add_generation_prompt'\\]"):
        await client.chat.completions.create(model="policy", messages=messages,
                                             chat_template_kwargs={"add_generation_prompt": False})


def test_a_parser_name_or_pair_that_does_not_fit_is_refused_at_start_up_naming_the_fix(tiny_model_path):
    tokenizer = format_tokenizer(tiny_model_path, FORMATS["qwen3_coder"])  # ChatML with XML calls
    with pytest.raises(ValueError, match=r"unknown tool parser 'xml'; ours: \['hermes', 'qwen'\]; vLLM's: .*qwen3_xml"):
        make_tool_parser("xml", tokenizer)
    with pytest.raises(ValueError, match="'mistral' does not fit this model's tokenizer"):
        make_tool_parser("mistral", tokenizer)  # no [TOOL_CALLS] token
    with pytest.raises(ValueError, match="does not read back the tool call"):
        check_chat_setup(tokenizer, make_tool_parser("hermes"), "model.chat_template=xml.jinja")
    check_chat_setup(tokenizer, make_tool_parser("qwen3_xml", tokenizer), "model.chat_template=xml.jinja")
    with pytest.raises(ValueError, match="unknown reasoning parser 'thinky'"):
        ReasoningSplitter("thinky", tokenizer)
    with pytest.raises(ValueError, match="'deepseek_r1' does not fit this model's tokenizer"):
        ReasoningSplitter("deepseek_r1", tokenizer)  # no <think> tokens
