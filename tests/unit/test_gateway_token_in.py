"""vLLM's token-in dialect through the gateway (`/inference/v1/generate`, `/tokenize`, `/detokenize`), as a
trainer-side client that renders its own prompts calls it (verifiers' renderer client, prime-rl), with raw HTTP.

Real client, gateway and template (SmolLM2 + chatml-tools); only the engine is the edge fake that "samples"
scripted tokens. A multi-turn episode whose client stitches its own prompt ids is recorded token-exactly as one
sequence, the weight version of every sampled token comes back in the answer, and hostile bodies get a 400 naming
what was wrong (never a 404 or 500), with nothing recorded."""

from __future__ import annotations

import json

import httpx
import pytest
from scripted_engine import assert_one_exact_sequence, chat_tokenizer, scripted_gateway
from scripted_engine import script_texts as script

FIRST = "Let me think: 3 + 4 is 7."
SECOND = "So the answer is 7."
QUESTION = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


@pytest.fixture
async def served(tokenizer):
    async with scripted_gateway(tokenizer, max_model_len=512) as (gateway, engine):
        yield gateway, engine, tokenizer


def _root(episode) -> str:
    """The episode's base URL without `/v1`: where vLLM serves `/inference/v1/generate` and `/tokenize`."""
    return episode.base_url.removesuffix("/v1")


async def _generate(http: httpx.AsyncClient, root: str, body: dict) -> dict:
    """A generate answer, whole or assembled from its stream (as a streaming client reads it)."""
    if not body.get("stream"):
        answer = await http.post(f"{root}/inference/v1/generate", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()
    async with http.stream("POST", f"{root}/inference/v1/generate", json=body) as answer:
        assert answer.status_code == 200
        lines = [line async for line in answer.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    assert all(choice["finish_reason"] is None for choice in choices[:-1])
    whole = {**choices[-1], "token_ids": [t for c in choices for t in c["token_ids"]],
             "text": "".join(c.get("text", "") for c in choices)}
    if body["sampling_params"].get("logprobs") is not None:
        whole["logprobs"] = {"content": [entry for c in choices for entry in c["logprobs"]["content"]]}
    return {**chunks[0], "choices": [whole], "usage": chunks[-1].get("usage")}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_renders_its_own_prompts_trains_one_exact_sequence_with_each_tokens_version(
        served, stream):
    gateway, engine, tokenizer = served
    script(engine, tokenizer, FIRST, SECOND)
    engine.push_after(0, 4)  # a weight push interrupts the first answer after 4 tokens; it continues under v1
    episode = gateway.open_episode()
    root = _root(episode)
    async with httpx.AsyncClient(timeout=30) as http:
        rendered = (await http.post(f"{root}/tokenize", json={"model": "policy", "messages": QUESTION})).json()
        assert rendered["count"] == len(rendered["tokens"]) and rendered["max_model_len"] == 512
        sampling = {"max_tokens": 40, "temperature": 1.0, "logprobs": 0, "skip_special_tokens": False}
        body = {"model": "policy", "token_ids": rendered["tokens"], "sampling_params": sampling,
                "return_token_ids": True, "stream": stream, "cache_salt": "per-run-secret", "priority": 0}
        first = await _generate(http, root, body)
        (choice,) = first["choices"]
        wanted = tokenizer.encode(FIRST, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert choice["token_ids"] == wanted and choice["finish_reason"] == "stop"
        assert first["prompt_token_ids"] == rendered["tokens"]
        assert [entry["token_id"] for entry in choice["logprobs"]["content"]] == wanted
        assert all(entry["logprob"] == -0.5 and entry["top_logprobs"][0]["token_id"] == entry["token_id"]
                   for entry in choice["logprobs"]["content"])
        assert choice["weight_versions"] == [{"version": "0", "start": 0, "end": 4},
                                             {"version": "1", "start": 4, "end": len(wanted)}]
        # the next turn's prompt: the sampled ids as they are, then the bridge the client renders itself
        bridge = (await http.post(f"{root}/tokenize", json={"prompt": "<|im_start|>user\nAre you sure?<|im_end|>\n"
                                                            "<|im_start|>assistant\n", "add_special_tokens": False}
                                  )).json()["tokens"]
        newline = tokenizer.encode("\n", add_special_tokens=False)
        body["token_ids"] = rendered["tokens"] + choice["token_ids"] + newline + bridge
        second = await _generate(http, root, body)
        assert second["choices"][0]["token_ids"] == tokenizer.encode(SECOND, add_special_tokens=False) + [
            tokenizer.eos_token_id]
    gateway.close_episode(episode)
    assert_one_exact_sequence(episode.client, calls=2)
    recorded = episode.client.trajectory(reward=1.0).calls[0]
    assert recorded.output_versions == (0,) * 4 + (1,) * (len(wanted) - 4)  # what the answer said, recorded


async def test_tokenize_gives_the_ids_a_chat_call_generates_from_and_detokenize_their_text(served):
    gateway, engine, tokenizer = served
    script(engine, tokenizer, FIRST)
    episode = gateway.open_episode()
    root = _root(episode)
    tools = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}]
    async with httpx.AsyncClient(timeout=30) as http:
        ids = (await http.post(f"{root}/tokenize", json={"messages": QUESTION, "tools": tools,
                                                          "return_token_strs": True})).json()
        chat = await http.post(f"{episode.base_url}/chat/completions",
                               json={"model": "policy", "messages": QUESTION, "tools": tools, "max_tokens": 40})
        assert chat.status_code == 200
        assert episode.client.episode.calls[-1].prompt_ids == tuple(ids["tokens"])  # the same template, same ids
        assert "".join(ids["token_strs"]) == tokenizer.decode(ids["tokens"])
        without = (await http.post(f"{root}/tokenize", json={"messages": QUESTION, "tools": tools,
                                                              "add_generation_prompt": False})).json()["tokens"]
        assert ids["tokens"][: len(without)] == without and len(without) < len(ids["tokens"])
        text = (await http.post(f"{root}/detokenize", json={"model": "policy", "tokens": ids["tokens"]})).json()
        assert text["prompt"] == tokenizer.decode(ids["tokens"])  # special tokens included, as vLLM decodes
    gateway.close_episode(episode)
    assert len(episode.client.trajectory(reward=0.0).calls) == 1  # tokenizing records nothing


@pytest.mark.parametrize("stream", [False, True])
async def test_text_mode_cuts_at_the_stop_string_unless_asked_to_keep_it(served, stream):
    gateway, engine, tokenizer = served
    ids = tokenizer.encode("The answer is 7. END more", add_special_tokens=False)
    cut = len(tokenizer.encode("The answer is 7. END", add_special_tokens=False))
    episode = gateway.open_episode()
    root = _root(episode)
    async with httpx.AsyncClient(timeout=30) as http:
        for keep in (False, True):
            engine.script.append((ids[:cut], " END"))
            body = {"token_ids": tokenizer.encode("Q:"), "output_mode": "text", "stream": stream,
                    "sampling_params": {"stop": [" END"], "max_tokens": 30, "include_stop_str_in_output": keep}}
            answer = await _generate(http, root, body)
            (choice,) = answer["choices"]
            assert choice["text"] == ("The answer is 7. END" if keep else "The answer is 7.")
            assert choice["token_ids"] == ids[:cut] and choice["stop_reason"] == " END"
            assert answer["output_mode"] == "text"
    gateway.close_episode(episode)


async def test_n_choices_are_each_recorded_and_the_stop_token_ids_reach_the_engine(served):
    gateway, engine, tokenizer = served
    script(engine, tokenizer, FIRST, SECOND)
    episode = gateway.open_episode()
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{_root(episode)}/inference/v1/generate", json={
            "token_ids": [1, 2, 3], "sampling_params": {"n": 2, "max_tokens": 40, "stop_token_ids": [5]}})
    assert answer.status_code == 200
    body = answer.json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == sum(
        len(choice["token_ids"]) for choice in body["choices"])
    gateway.close_episode(episode)
    calls = episode.client.trajectory(reward=0.0).calls
    assert len(calls) == 2 and all(call.prompt_ids == (1, 2, 3) for call in calls)
    assert [request.sampling.stop_token_ids for request in engine.requests] == [(5,), (5,)]


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"token_ids": [1, 10**7], "sampling_params": {}}, 400, "outside the vocabulary"),
    ({"token_ids": [1, -2]}, 400, "token_ids[1]"),
    ({"token_ids": []}, 400, "token_ids"),
    ({"token_ids": [1] * 600}, 400, "maximum context length is 512"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 600}}, 400, "maximum context length"),
    ({"token_ids": [1], "sampling_params": {"best_of": 2}}, 400, "sampling_params.best_of"),
    ({"token_ids": [1], "sampling_params": {"logprobs": -1}}, 400, "whole vocabulary"),
    ({"token_ids": [1], "sampling_params": {"logprobs": 50}}, 400, "top log-probs"),
    ({"token_ids": [1], "sampling_params": {"presence_penalty": 0.5}}, 400, "presence_penalty"),
    ({"token_ids": [1], "sampling_params": {"min_tokens": 3}}, 400, "min_tokens"),
    ({"token_ids": [1], "sampling_params": {"prompt_logprobs": 1}}, 400, "prompt_logprobs"),
    ({"token_ids": [1], "sampling_params": {"stop_token_ids": [10**7]}}, 400, "stop token id"),
    ({"token_ids": [1], "sampling_params": {"stop": ["x"], "detokenize": False}}, 400, "detokenize"),
    ({"token_ids": [1], "sampling_params": {"n": 2}, "stream": True}, 400, "n=1"),
    ({"token_ids": [1], "features": {"mm_hashes": {}}}, 400, "multimodal"),
    ({"token_ids": [1], "kv_transfer_params": {"x": 1}}, 400, "disaggregated"),
    ({"token_ids": [1], "model": "other"}, 400, "unknown model"),
    ({"token_ids": [1], "output_mode": "bytes"}, 400, "output_mode"),
])
async def test_a_hostile_generate_body_is_refused_naming_what_was_wrong_and_records_nothing(served, body, status,
                                                                                           says):
    gateway, engine, tokenizer = served
    episode = gateway.open_episode()
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{_root(episode)}/inference/v1/generate", json=body)
    assert answer.status_code == status, answer.text
    assert says in answer.json()["error"]["message"]
    gateway.close_episode(episode)
    assert episode.client.episode.settled_calls() == [] and engine.requests == []


async def test_tokenize_and_detokenize_refuse_bad_bodies_and_unknown_episodes(served):
    gateway, _, _ = served
    episode = gateway.open_episode()
    root = _root(episode)
    async with httpx.AsyncClient(timeout=30) as http:
        both = await http.post(f"{root}/tokenize", json={"prompt": "x", "messages": QUESTION})
        far = await http.post(f"{root}/detokenize", json={"tokens": [10**7]})
        unknown = await http.post(f"{root}/tokenize", json={"prompt": "x", "chat_template": "{{ x }}"})
        missing = await http.post(f"{root.rsplit('/', 1)[0]}/nobody/inference/v1/generate", json={"token_ids": [1]})
    assert both.status_code == 400 and "one of `prompt` and `messages`" in both.json()["error"]["message"]
    assert far.status_code == 400 and "outside the vocabulary" in far.json()["error"]["message"]
    assert unknown.status_code == 400 and "chat_template" in unknown.json()["error"]["message"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "episode_not_found"
    gateway.close_episode(episode)


async def test_chat_log_probs_name_tokens_by_id_on_request_and_vllm_extras_are_accepted(served):
    gateway, engine, tokenizer = served
    script(engine, tokenizer, FIRST)
    episode = gateway.open_episode()
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{episode.base_url}/chat/completions", json={
            "model": "policy", "messages": QUESTION, "max_tokens": 40, "logprobs": True,
            "return_tokens_as_token_ids": True, "return_token_ids": True, "skip_special_tokens": False,
            "cache_salt": "s", "stop_token_ids": [tokenizer.eos_token_id]})
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert [entry["token"] for entry in choice["logprobs"]["content"]] == [
        f"token_id:{i}" for i in choice["token_ids"]]
    assert choice["message"]["content"] == FIRST
    gateway.close_episode(episode)
