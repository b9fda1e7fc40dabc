"""One base URL and one HTTP client for every episode of a run: the gateway's run-wide routes, each request naming
its episode in the X-Session-ID header (verifiers' clients send it: `extra_headers_from_state`).

Real client, gateway and template (SmolLM2 + chatml-tools); only the engine is the edge fake. Sixteen concurrent
episodes through one `AsyncOpenAI` record exactly their own calls; the token-in and Anthropic routes take the same
header; a request naming no episode, an unknown one or a finished one gets a 404 saying what to send, and records
nothing."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import pytest
from openai import AsyncOpenAI, NotFoundError
from scripted_engine import chat_tokenizer, scripted_gateway
from scripted_engine import script_texts as script

EPISODES = 16


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


async def test_sixteen_concurrent_episodes_through_one_client_each_record_exactly_their_own_calls(tokenizer):
    async with scripted_gateway(tokenizer, max_model_len=512) as (gateway, engine):
        script(engine, tokenizer, *(f"answer {i}" for i in range(2 * EPISODES)))
        episodes = [gateway.open_episode() for _ in range(EPISODES)]
        client = AsyncOpenAI(base_url=gateway.run_base_url, api_key="one-key-for-the-run", max_retries=0)

        async def episode(index: int) -> None:
            named = {"X-Session-ID": episodes[index].api_key}
            messages = [{"role": "user", "content": f"I am episode {index}."}]
            first = await client.chat.completions.create(model="policy", messages=messages, extra_headers=named)
            messages += [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": f"Episode {index} again."}]
            stream = await client.chat.completions.create(model="policy", messages=messages, extra_headers=named,
                                                          stream=True)
            async for _ in stream:
                pass

        await asyncio.gather(*(episode(i) for i in range(EPISODES)))
        for index, opened in enumerate(episodes):
            calls = opened.client.episode.calls
            assert len(calls) == 2
            prompts = [tokenizer.decode(call.prompt_ids) for call in calls]
            assert f"I am episode {index}." in prompts[0] and f"Episode {index} again." in prompts[1]
            assert all(f"episode {other}." not in " ".join(prompts) for other in range(EPISODES) if other != index)
            assert calls[1].prompt_ids[:len(calls[0].prompt_ids)] == calls[0].prompt_ids  # one sequence
            gateway.close_episode(opened)
        await client.close()


async def test_the_token_in_and_anthropic_routes_take_the_header_too(tokenizer):
    async with scripted_gateway(tokenizer, max_model_len=512) as (gateway, engine):
        script(engine, tokenizer, "seven", "eight")
        episode = gateway.open_episode()
        named = {"X-Session-ID": episode.api_key}
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            ids = (await http.post("/tokenize", json={"model": "policy", "prompt": "3 + 4 ="}, headers=named)).json()
            answer = await http.post("/inference/v1/generate", headers=named, json={
                "model": "policy", "token_ids": ids["tokens"], "sampling_params": {"max_tokens": 8}})
            assert answer.status_code == 200, answer.text
        sdk = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0, default_headers=named)
        said = await sdk.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": "go"}])
        assert said.content[0].text == "eight"
        assert [tokenizer.decode(call.output_ids, skip_special_tokens=True)
                for call in episode.client.episode.calls] == ["seven", "eight"]
        gateway.close_episode(episode)


async def test_a_request_naming_no_running_episode_is_told_what_to_send_and_records_nothing(tokenizer):
    async with scripted_gateway(tokenizer, max_model_len=512) as (gateway, engine):
        episode = gateway.open_episode()
        client = AsyncOpenAI(base_url=gateway.run_base_url, api_key="k", max_retries=0)
        ask = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(NotFoundError, match="send the header X-Session-ID"):
            await client.chat.completions.create(**ask)
        with pytest.raises(NotFoundError, match="episode is unknown"):
            await client.chat.completions.create(**ask, extra_headers={"X-Session-ID": "not-a-key"})
        gateway.close_episode(episode)
        with pytest.raises(NotFoundError, match="episode has finished"):
            await client.chat.completions.create(**ask, extra_headers={"X-Session-ID": episode.api_key})
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            missing = await http.post("/v1/messages", json={"model": "policy", "max_tokens": 4, "messages": []})
            assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        assert engine.requests == [] and episode.client.episode.calls == []
        await client.close()


async def test_the_path_names_the_episode_when_both_do(tokenizer):
    async with scripted_gateway(tokenizer, max_model_len=512) as (gateway, engine):
        script(engine, tokenizer, "mine")
        mine, other = gateway.open_episode(), gateway.open_episode()
        client = AsyncOpenAI(base_url=mine.base_url, api_key=mine.api_key, max_retries=0)
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                             extra_headers={"X-Session-ID": other.api_key})
        assert len(mine.client.episode.calls) == 1 and other.client.episode.calls == []
        for episode in (mine, other):
            gateway.close_episode(episode)
        await client.close()
