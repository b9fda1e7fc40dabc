"""A call is recorded only when its answer reached the harness, and a retry joins the work it repeats (real vLLM
behind the gateway, the openai SDK and httpx in front). The engine is frozen (paused, KEEP) where a test needs a
request to be still running when the harness gives up: nothing here hopes one thing is slower than another."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from fullasync.contracts.engine import PauseMode
from fullasync.gateway.delivery import ABANDON_GRACE_S

IDLE_DEADLINE_S = 30.0  # bounds a hang only; the time the engine took to go idle is asserted against the grace


async def idle_after(engine, since: float) -> float:
    """Seconds from `since` until the engine has no request in flight."""
    async with asyncio.timeout(IDLE_DEADLINE_S):
        while await engine.num_in_flight():
            await asyncio.sleep(0.01)
    return time.monotonic() - since


async def running(gateway, episode, count: int) -> None:
    """Until the gateway runs `count` productions of `episode` (its requests, each in a task of its own)."""
    async with asyncio.timeout(IDLE_DEADLINE_S):
        while gateway.deliveries.running(episode.api_key) < count:
            await asyncio.sleep(0.01)


async def in_flight(engine, count: int) -> None:
    async with asyncio.timeout(IDLE_DEADLINE_S):
        while await engine.num_in_flight() < count:
            await asyncio.sleep(0.01)


@pytest.fixture
async def frozen(engine):
    """The engine paused (KEEP): requests reach it and wait; resumed after the test whatever happens."""
    await engine.pause(PauseMode.KEEP)
    try:
        yield engine
    finally:
        await engine.resume()


async def test_sdk_timeouts_and_retries_leave_only_the_completion_the_harness_received(gateway, frozen):
    episode = gateway.open_episode()
    abandoned, joined = gateway.deliveries.abandoned_calls, gateway.deliveries.joined_requests
    impatient = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, timeout=0.3, max_retries=3)
    messages = [{"role": "user", "content": "Tell me a long story."}]
    with pytest.raises(openai.APITimeoutError):  # four attempts, each given up after 0.3 s
        await impatient.chat.completions.create(model="policy", messages=messages, max_tokens=600)
    gave_up = time.monotonic()
    took = await idle_after(frozen, gave_up)  # the abandoned work was cancelled and its engine request aborted
    assert took < IDLE_DEADLINE_S
    print(f"engine idle {took:.2f} s after the harness gave up (grace {ABANDON_GRACE_S} s)")
    assert gateway.deliveries.abandoned_calls > abandoned
    assert gateway.deliveries.joined_requests > joined  # a retry within the grace joined the running request
    assert episode.client.episode.calls == []  # nothing the harness did not receive
    await frozen.resume()
    patient = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, timeout=120, max_retries=0)
    reply = await patient.chat.completions.create(model="policy", messages=messages, max_tokens=4,
                                                  extra_body={"return_token_ids": True})
    (call,) = episode.client.episode.calls  # exactly the one completion the harness received
    assert list(call.output_ids) == reply.choices[0].model_extra["token_ids"] and len(call.output_ids) <= 4
    gateway.close_episode(episode)


@pytest.mark.parametrize("stream", [False, True])
async def test_identical_requests_on_open_connections_are_sampled_apart_and_a_retry_joins(gateway, frozen, stream):
    """Best-of-n by eight identical requests: eight engine requests, eight records. Then a harness that hangs up and
    sends the same bytes again gets the one completion of its first request (one engine request, one record)."""
    episode = gateway.open_episode()
    joined = gateway.deliveries.joined_requests
    sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, timeout=120, max_retries=0)
    kwargs = dict(model="policy", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
                  temperature=1.0)

    async def ask() -> list[int] | None:
        if not stream:
            reply = await sdk.chat.completions.create(**kwargs, extra_body={"return_token_ids": True})
            return reply.choices[0].model_extra["token_ids"]
        async for _chunk in await sdk.chat.completions.create(**kwargs, stream=True):
            pass
        return None

    candidates = []
    for opened in range(1, 9):
        candidates.append(asyncio.create_task(ask()))
        if stream:  # opened one after another: a burst of eight streams once left one undispatched by the server
            await running(gateway, episode, opened)
    await in_flight(frozen, 8)  # every one reached the engine: none joined another
    await frozen.resume()
    received = await asyncio.gather(*candidates)
    assert gateway.deliveries.joined_requests == joined and len(episode.client.episode.calls) == 8
    if not stream:  # eight records, each the completion one harness request received
        assert sorted(list(call.output_ids) for call in episode.client.episode.calls) == sorted(received)

    await frozen.pause(PauseMode.KEEP)
    before = len(episode.client.episode.calls)
    body = {**kwargs, "stream": stream}
    async with httpx.AsyncClient(timeout=120) as http:
        first = asyncio.create_task(http.post(f"{episode.base_url}/chat/completions", json=body))
        await in_flight(frozen, 1)
        first.cancel()  # the harness's timeout: its connection closes, the work waits for a retry
        with pytest.raises(asyncio.CancelledError):
            await first
        retry = asyncio.create_task(http.post(f"{episode.base_url}/chat/completions", json=body))
        async with asyncio.timeout(IDLE_DEADLINE_S):
            while gateway.deliveries.joined_requests == joined:
                await asyncio.sleep(0.01)
        assert await frozen.num_in_flight() == 1  # the retry took over the first request's engine request
        await frozen.resume()
        assert (await retry).status_code == 200
    assert len(episode.client.episode.calls) == before + 1  # recorded once
    gateway.close_episode(episode)


async def test_a_stream_whose_client_disconnects_is_cancelled_and_not_recorded(gateway, frozen):
    episode = gateway.open_episode()
    abandoned = gateway.deliveries.abandoned_calls
    body = {"model": "policy", "messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 600,
            "stream": True}
    async with httpx.AsyncClient(timeout=120) as http:
        async with http.stream("POST", f"{episode.base_url}/chat/completions", json=body) as response:
            assert response.status_code == 200
            async for _line in response.aiter_lines():
                break  # the first event arrived
            await in_flight(frozen, 1)  # the request reached the engine (frozen there): hang up
    gave_up = time.monotonic()
    took = await idle_after(frozen, gave_up)
    print(f"engine idle {took:.2f} s after the stream's client hung up")
    assert gateway.deliveries.abandoned_calls == abandoned + 1
    await frozen.resume()
    await asyncio.sleep(ABANDON_GRACE_S * 2)  # a late finish of the cancelled work would show up in the record
    assert episode.client.episode.calls == []
    gateway.close_episode(episode)


async def test_a_json_request_whose_client_disconnects_records_nothing_even_if_it_finishes(gateway, frozen):
    """The work finishes during the grace with nobody to receive it: it is dropped, not recorded."""
    episode = gateway.open_episode()
    abandoned = gateway.deliveries.abandoned_calls
    body = {"model": "policy", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}
    async with httpx.AsyncClient(timeout=120) as http:
        request = asyncio.create_task(http.post(f"{episode.base_url}/chat/completions", json=body))
        await in_flight(frozen, 1)
        request.cancel()  # the harness gives up: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await request
    await frozen.resume()  # the request may now finish within the grace, with nobody waiting for it
    async with asyncio.timeout(IDLE_DEADLINE_S):
        while gateway.deliveries.abandoned_calls == abandoned:
            await asyncio.sleep(0.01)
    assert episode.client.episode.calls == []
    gateway.close_episode(episode)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_running_when_its_episode_ends_is_stopped_and_answered_that_the_episode_ended(gateway, frozen,
                                                                                                     stream):
    """The row was stopped (too stale, the run's end) while its harness waited for a completion: the engine
    request is aborted, the harness gets a 404 saying why (not a 500) or a stream that stops, and it counts as
    ended, not abandoned."""
    episode = gateway.open_episode()
    abandoned, ended = gateway.deliveries.abandoned_calls, gateway.deliveries.ended_calls
    body = {"model": "policy", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4, "stream": stream}
    async with httpx.AsyncClient(timeout=120) as http:
        request = asyncio.create_task(http.post(f"{episode.base_url}/chat/completions", json=body))
        await in_flight(frozen, 1)  # the request reached the engine and waits there
        gateway.close_episode(episode)
        response = await request
    await idle_after(frozen, time.monotonic())
    if stream:  # its first chunk (the role) went out at once: the stream just stops, without a finish or [DONE]
        assert response.status_code == 200 and "finish_reason\":\"" not in response.text
        assert "[DONE]" not in response.text
    else:
        assert response.status_code == 404 and "ended while this request ran" in response.json()["error"]["message"]
    assert (gateway.deliveries.ended_calls, gateway.deliveries.abandoned_calls) == (ended + 1, abandoned)
    assert episode.client.episode.calls == []
