"""The gateway with real HTTP clients: the openai SDK and litellm, streaming and not, tool calls,
weight pushes mid-stream, and helpful 4xx errors that record nothing (real vLLM behind it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os

import httpx
import pytest
from events import frozen_mid_generation
from openai import AsyncOpenAI
from test_client_chat import TOOLS, spelled, tool_call_regex


def assert_token_exact(client, rendered_messages, tokenizer):
    calls = client.episode.calls
    for earlier, later in zip(calls, calls[1:]):
        assert later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids
    (sequence,) = client.trajectory(reward=1.0).to_sequences()
    assert [sequence.logprobs[i] for i, m in enumerate(sequence.loss_mask) if m] == [
        lp for c in calls for lp in c.output_logprobs
    ]
    assert [sequence.versions[i] for i, m in enumerate(sequence.loss_mask) if m] == [
        v for c in calls for v in c.output_versions
    ]
    rendered = tokenizer.apply_chat_template(rendered_messages, tools=TOOLS, tokenize=False)
    assert spelled(tokenizer, sequence.token_ids) == rendered.rstrip("\n")


async def collect_stream(stream):
    content, calls, finish = "", {}, None
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, list(calls.values()), finish


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_tool_episode_is_token_exact(gateway, tokenizer, stream):
    episode = gateway.open_episode()
    sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key)
    messages = [{"role": "user", "content": "What is (3 + 4) + 5? Use the add tool."}]
    for a, b, result in [(3, 4, 7), (7, 5, 12)]:
        kwargs = dict(model="policy", messages=messages, tools=TOOLS, max_tokens=60,
                      extra_body={"structured_outputs": {"regex": tool_call_regex(a, b)}})
        if stream:
            content, calls, finish = await collect_stream(await sdk.chat.completions.create(stream=True, **kwargs))
            call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["arguments"]
            assistant = {"role": "assistant", "content": content or None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}
        else:
            response = await sdk.chat.completions.create(**kwargs)
            finish, (call,) = response.choices[0].finish_reason, response.choices[0].message.tool_calls
            call_id, name, arguments = call.id, call.function.name, call.function.arguments
            assistant = response.choices[0].message.model_dump(exclude_none=True)
        assert finish == "tool_calls" and name == "add" and json.loads(arguments) == {"a": a, "b": b}
        messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": str(result)}]
    final = await sdk.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, max_tokens=30,
        extra_body={"structured_outputs": {"regex": "The answer is 12\\."}})
    messages.append({"role": "assistant", "content": final.choices[0].message.content})
    gateway.close_episode(episode)
    assert len(episode.client.episode.calls) == 3
    assert_token_exact(episode.client, messages, tokenizer)


async def test_litellm_multi_turn_as_agent_harnesses_use_it(gateway, tokenizer):
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the price list from the internet
    import litellm

    episode = gateway.open_episode()
    messages = [{"role": "user", "content": "What is 3 + 4? Use the add tool."}]
    response = await litellm.acompletion(
        model="hosted_vllm/policy", api_base=episode.base_url, api_key=episode.api_key, messages=messages,
        tools=TOOLS, max_tokens=60, structured_outputs={"regex": tool_call_regex(3, 4)})
    call = response.choices[0].message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 3, "b": 4}
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "add", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "7"}]
    stream = await litellm.acompletion(
        model="openai/policy", api_base=episode.base_url, api_key=episode.api_key, messages=messages,
        tools=TOOLS, max_tokens=20, stream=True, extra_body={"structured_outputs": {"regex": "It is 7\\."}})
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == "It is 7."
    messages.append({"role": "assistant", "content": text})
    gateway.close_episode(episode)
    assert len(episode.client.episode.calls) == 2
    assert_token_exact(episode.client, messages, tokenizer)


@pytest.mark.parametrize("interval", [1, 8])
async def test_weight_push_mid_stream_is_one_continuous_stream(gateway, engine, policy, interval):
    """Also at a stream interval of 8 (`rollout.stream_interval`): after the first, chunks of >= 8 tokens but the
    last, across the push's resubmission."""
    episode = gateway.open_episode()
    sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key)

    async def consume() -> tuple[list[int], list[int], str, list[int]]:
        stream = await sdk.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Tell a long story."}], max_tokens=150,
            stream=True, extra_body={"ignore_eos": True, "return_token_ids": True})
        ids, text, prompt_ids, sizes = [], "", [], []
        async for chunk in stream:
            prompt_ids += chunk.model_extra.get("prompt_token_ids") or []  # chunk level, first chunk (as vLLM)
            for choice in chunk.choices:
                chunk_ids = choice.model_extra.get("token_ids") or []
                ids += chunk_ids
                sizes += [len(chunk_ids)] if chunk_ids else []
                text += choice.delta.content or ""
        return prompt_ids, ids, text, sizes

    config = gateway.service.config
    gateway.service.config = dataclasses.replace(config, stream_interval=interval)
    try:
        # at interval 8 the push installs the same weights again (a push all the same: a pause, an abort, a new
        # version), so that the tests after this one see the weights they always saw
        weights = policy.perturbed(seed=21, scale=0.05 if interval == 1 else 0.0)
        reader = asyncio.create_task(consume())
        async with frozen_mid_generation(engine, episode.episode_id, at_least=20, budget=150):
            await policy.push(weights)  # its pause (ABORT) interrupts the frozen stream's request
        prompt_ids, ids, text, sizes = await reader
    finally:
        gateway.service.config = config
    if interval > 1:
        assert min(sizes[1:-1]) >= interval and len(sizes) <= 2 + 149 // interval
    (call,) = episode.client.episode.calls
    assert prompt_ids == list(call.prompt_ids) and ids == list(call.output_ids)  # every token once
    assert text == episode.client.service.chat_tokens.decode(call.output_ids)
    assert len(call.output_ids) == 150 and call.num_resumes == 1
    assert len(set(call.output_versions)) == 2  # the push shows in the record, not in the stream


BAD = [
    ("POST", "/sessions/{key}/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("POST", "/sessions/{key}/v1/chat/completions", {"model": "policy", "messages": [], "max_tokens": 3}, 400,
     "messages must be a non-empty list"),
    ("POST", "/sessions/{key}/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
     400, "unknown model 'gpt-4'"),
    ("POST", "/sessions/{key}/v1/chat/completions", {"model": "policy", "messages": [{"role": "user", "content": "x"}],
                                                      "functions": []}, 400, "unsupported parameter(s) ['functions']"),
    ("POST", "/sessions/{key}/v1/chat/completions",
     {"model": "policy", "messages": [{"role": "user", "content": "x " * 3000}]}, 400,
     "This model's maximum context length is"),
    ("POST", "/sessions/{key}/v1/completions", {"model": "policy", "prompt": "x", "max_tokens": 0}, 400,
     "max_tokens must be a positive integer"),
    ("POST", "/sessions/not-a-key/v1/chat/completions", {"model": "policy"}, 404, "episode is unknown"),
]


@pytest.mark.parametrize("method, path, body, status, message", BAD)
async def test_bad_requests_get_4xx_with_a_helpful_message_and_record_nothing(gateway, method, path, body, status,
                                                                              message):
    episode = gateway.open_episode()
    url = gateway.url + path.format(key=episode.api_key)
    async with httpx.AsyncClient(timeout=120) as http:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await http.request(method, url, content=content, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert message in response.json()["error"]["message"]
    assert episode.client.episode.calls == []


async def test_finished_episode_and_model_list(gateway):
    episode = gateway.open_episode()
    gateway.close_episode(episode)
    async with httpx.AsyncClient(timeout=120) as http:
        finished = await http.post(episode.base_url + "/chat/completions", json={"model": "policy", "messages": []})
        models = await http.get(gateway.url + "/v1/models")
    assert finished.status_code == 404 and "has finished" in finished.json()["error"]["message"]
    assert models.json()["data"][0]["id"] == "policy"


async def test_hundreds_of_open_episodes(gateway):
    episodes = [gateway.open_episode() for _ in range(200)]
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as http:
        responses = await asyncio.gather(*(
            http.post(e.base_url + "/completions", json={"model": "policy", "prompt": "1 + 1 =", "max_tokens": 2})
            for e in episodes))
    assert all(r.status_code == 200 for r in responses)
    assert all(len(e.client.episode.calls) == 1 for e in episodes)


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_choice_named_and_required_hold_real_vllm_to_calls(gateway, stream):
    """A constrained tool_choice through structured outputs on the real engine: the answer is a call, whatever the
    (random) policy would have written — also beside a response_format, as the OpenAI Agents SDK sends it with an
    output type (vLLM's rule: the tool constraint wins for that call)."""
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"op": {"enum": ["add", "sub"]}}, "required": ["op"],
        "additionalProperties": False}}}]
    episode = gateway.open_episode()
    sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key)
    messages = [{"role": "user", "content": "Pick an operation."}]
    output_type = {"type": "json_schema", "json_schema": {"name": "final_output", "strict": True, "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
    for choice, extra in (({"type": "function", "function": {"name": "pick"}}, {}), ("required", {}),
                          ("required", {"response_format": output_type})):
        kwargs = dict(model="policy", messages=messages, tools=tools, tool_choice=choice, max_tokens=200,
                      temperature=0, **extra)
        if stream:
            content, calls, finish = await collect_stream(await sdk.chat.completions.create(stream=True, **kwargs))
            names = [(c["name"], json.loads(c["arguments"])) for c in calls]
        else:
            message = (await sdk.chat.completions.create(**kwargs)).choices[0]
            content, finish = message.message.content, message.finish_reason
            names = [(c.function.name, json.loads(c.function.arguments)) for c in message.message.tool_calls]
        assert finish == "tool_calls" and not content
        assert [name for name, _ in names][:1] == ["pick"] and all(args["op"] in ("add", "sub") for _, args in names)
    gateway.close_episode(episode)
    assert len(episode.client.episode.calls) == 3


async def test_streamed_chunks_carry_only_the_fields_they_set_as_vllm_sends_them(gateway):
    """Each SSE event is one chunk with the delta's own fields (no nulls for the fields it does not use); the
    choice keeps `finish_reason` and `logprobs` (null until the end), and the text is the JSON answer's."""
    episode = gateway.open_episode()
    request = {"model": "policy", "messages": [{"role": "user", "content": "Count: 1 2 3"}], "max_tokens": 12,
               "temperature": 0.0}
    async with httpx.AsyncClient(timeout=120) as http:
        answer = (await http.post(episode.base_url + "/chat/completions", json=request)).json()
        streamed = await http.post(episode.base_url + "/chat/completions", json={**request, "stream": True})
    events = [line.removeprefix("data: ") for line in streamed.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunk in chunks:
        assert set(chunk) == {"id", "object", "created", "model", "choices"}
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "delta", "finish_reason", "logprobs"}
        assert None not in choice["delta"].values()
    assert chunks[-1]["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert text == answer["choices"][0]["message"]["content"]
    gateway.close_episode(episode)


async def test_the_gateway_binds_the_configured_host_and_names_it_in_each_base_url(gateway):
    """`rollout.gateway_host` (IPv6 loopback here: nothing else may be bound on this machine) is where the gateway
    listens and what each episode's base URL names, bracketed as a URL needs; the key is still the only way in."""
    from fullasync.gateway import Gateway

    on_v6 = Gateway(gateway.service, host="::1")
    await on_v6.start()
    try:
        episode = on_v6.open_episode()
        assert episode.base_url.startswith(f"http://[::1]:{on_v6.port}/sessions/")
        sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key)
        answer = await sdk.completions.create(model="policy", prompt="1 + 1 =", max_tokens=2)
        assert answer.choices[0].text and len(episode.client.episode.calls) == 1
        async with httpx.AsyncClient(timeout=60) as http:
            guessed = await http.post(f"{on_v6.url}/sessions/not-a-key/v1/completions",
                                      json={"model": "policy", "prompt": "1", "max_tokens": 1})
        assert guessed.status_code == 404 and "is unknown" in guessed.json()["error"]["message"]
        on_v6.close_episode(episode)
    finally:
        await on_v6.stop()


@pytest.mark.parametrize("dialect", ["responses", "messages"])
async def test_weight_push_mid_stream_in_the_responses_and_anthropic_dialects(gateway, engine, policy, dialect):
    """The chat path's continuation under the two coding-agent dialects: a push interrupts a streamed answer, the
    harness's SDK sees one continuous event stream, and the record holds every token once, under two versions."""
    import anthropic

    episode = gateway.open_episode()
    asked = [{"role": "user", "content": "Tell a long story."}]

    async def consume() -> str:
        if dialect == "responses":
            sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)
            events = [e async for e in await sdk.responses.create(
                model="policy", input=asked, max_output_tokens=150, stream=True, extra_body={"ignore_eos": True})]
            assert events[-1].type == "response.incomplete"  # at its token limit, as OpenAI says it
            return "".join(e.delta for e in events if e.type == "response.output_text.delta")
        sdk = anthropic.AsyncAnthropic(base_url=episode.base_url.removesuffix("/v1"), api_key=episode.api_key,
                                       max_retries=0)
        async with sdk.messages.stream(model="policy", messages=asked, max_tokens=150,
                                       extra_body={"ignore_eos": True}) as stream:
            message = await stream.get_final_message()
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 150
        return message.content[0].text

    reader = asyncio.create_task(consume())
    async with frozen_mid_generation(engine, episode.episode_id, at_least=20, budget=150):
        await policy.push(policy.perturbed(seed=23, scale=0.0))  # the same weights again: a push all the same
    text = await reader
    (call,) = episode.client.episode.calls
    assert len(call.output_ids) == 150 and call.num_resumes == 1 and len(set(call.output_versions)) == 2
    assert text == episode.client.service.chat_tokens.decode(call.output_ids)
    gateway.close_episode(episode)
