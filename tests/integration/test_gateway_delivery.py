"""A call is recorded only when its answer reached the harness, and a retry joins the work it repeats (real vLLM
behind the gateway, the openai SDK and httpx in front). The engine is frozen (paused, KEEP) where a test needs a
request to be still running when the harness gives up: nothing here hopes one thing is slower than another."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import psutil
import pytest
from agents_common import literal
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


async def closed_on_the_gateway(port: int, peer: int | None = None) -> None:
    """Until the gateway listening on `port` closed its side of its connections (the one from `peer`, else all)."""
    def open_ones() -> list:
        return [c for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.laddr.port == port
                and (peer is None or c.raddr.port == peer)]
    async with asyncio.timeout(IDLE_DEADLINE_S):
        while open_ones():
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


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_left_unread_in_a_reset_connection_leaves_the_record_one_read_stays(gateway, stream):
    """The openai SDK timing out just as its answer arrives closes the connection with the answer unread: TCP resets
    it, and the call, recorded when its answer was written, leaves the episode (counted as unread). A client that
    read the answer and closed keeps it recorded. Made to happen: the client stops reading before it asks. A stream
    reset so is only in doubt: a client that read its answer resets it too when it closes with the stream's last
    events unread (the sync openai SDK stops at `[DONE]`); it is left out when its harness asks again instead of
    going on from it (`test_a_stream_hung_up_on_right_after_its_finish_...`)."""
    episode = gateway.open_episode()
    unread = gateway.deliveries.unread_calls
    url = httpx.URL(episode.base_url)
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4,
                       "stream": stream}).encode()
    request = (f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def ask(read: bool) -> None:
        before = len(episode.client.episode.calls)
        reader, writer = await asyncio.open_connection(url.host, url.port)
        port = writer.get_extra_info("sockname")[1]
        if not read:
            writer.transport.pause_reading()  # the answer stays in the kernel's buffer, unread
        writer.write(request)
        async with asyncio.timeout(IDLE_DEADLINE_S):
            while len(episode.client.episode.calls) == before:  # recorded once written
                await asyncio.sleep(0.01)
            if read:
                head = await reader.readuntil(b"\r\n\r\n")
                if stream:
                    await reader.readuntil(b"\r\n0\r\n\r\n")  # the last chunk of the chunked encoding
                else:
                    length = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                    await reader.readexactly(int(length.split(b":")[1]))
        writer.close()
        await closed_on_the_gateway(url.port, peer=port)

    await ask(read=True)
    assert len(episode.client.episode.calls) == 1 and gateway.deliveries.unread_calls == unread
    await ask(read=False)
    if stream:
        doubted = episode.client.episode.calls[-1]
        assert len(episode.client.episode.calls) == 2 and gateway.deliveries.unread_calls == unread
        assert id(doubted) in episode.client.episode.doubtful
    else:
        assert len(episode.client.episode.calls) == 1 and gateway.deliveries.unread_calls == unread + 1
        assert gateway.stats()["gateway/unread_calls"] == unread + 1
    gateway.close_episode(episode)


@pytest.mark.slow  # CI's slow tier: ~25 s
async def test_an_sdk_retry_after_its_answer_was_read_and_the_connection_closed_gets_that_answer(gateway):
    """The openai SDK's timer fires as the answer comes in: the answer was read off the socket and thrown away, the
    connection closed cleanly, and the SDK retries saying so (`x-stainless-retry-count: 1`). The retry gets that
    same answer (one sample, one record, now received); an identical request that is no retry is a new sample."""
    episode = gateway.open_episode()
    joined = gateway.deliveries.joined_requests
    url = f"{episode.base_url}/chat/completions"
    port = httpx.URL(episode.base_url).port
    body = {"model": "policy", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4,
            "return_token_ids": True}

    async def ask(retry: int | None) -> dict:
        async with httpx.AsyncClient(timeout=120) as http:  # a connection of its own, closed after the answer
            headers = {} if retry is None else {"x-stainless-retry-count": str(retry)}
            response = await http.post(url, json=body, headers=headers)
        await closed_on_the_gateway(port)
        assert response.status_code == 200, response.text
        return response.json()

    first = await ask(None)
    retried = await ask(1)
    assert retried["id"] == first["id"] and retried["choices"] == first["choices"]
    assert gateway.deliveries.joined_requests == joined + 1
    (call,) = episode.client.episode.calls  # one record, the answer both got
    assert list(call.output_ids) == first["choices"][0]["token_ids"]
    fresh = await ask(None)  # the same body, not a retry: sampled again and recorded
    assert fresh["id"] != first["id"] and len(episode.client.episode.calls) == 2
    gateway.close_episode(episode)


async def test_a_stream_hung_up_on_then_asked_again_is_not_trained_and_one_gone_on_from_is(gateway):
    """A harness breaks out of a stream and asks the same prompt again: its HTTP client may have read the whole
    stream off the socket before hanging up, and the connection then closes cleanly, as after a read. That call is
    doubtful, and is not trained since the harness asked again and never went on from it; the answer it went on
    from is trained, though its connection closed the same way (a fresh connection per call)."""
    episode = gateway.open_episode()
    url = f"{episode.base_url}/chat/completions"
    port = httpx.URL(episode.base_url).port
    messages = [{"role": "user", "content": "Hi."}]

    async def ask(messages: list, stream: bool) -> str:
        body = {"model": "policy", "messages": messages, "max_tokens": 4, "stream": stream}
        async with httpx.AsyncClient(timeout=120) as http:  # a connection of its own, closed after the answer
            response = await http.post(url, json=body)
        await closed_on_the_gateway(port)
        assert response.status_code == 200, response.text
        return "" if stream else response.json()["choices"][0]["message"]["content"]

    await ask(messages, stream=True)  # read whole, then hung up: the harness did not use it
    answer = await ask(messages, stream=False)  # the same prompt again
    await ask([*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "More."}],
              stream=False)  # goes on from the second answer
    hung_up, asked_again, went_on = episode.client.episode.calls
    assert hung_up.prompt_ids == asked_again.prompt_ids
    assert went_on.prompt_ids[:len(asked_again.all_ids)] == asked_again.all_ids  # token-exact continuation
    assert list(episode.client.trajectory(1.0).calls) == [asked_again, went_on]
    gateway.close_episode(episode)


async def test_a_stream_hung_up_on_right_after_its_finish_is_recorded_when_the_next_request_carries_it(gateway):
    """smolagents' streaming agent (the sync openai SDK) reads up to `[DONE]` and closes the connection, the end of the
    chunked body unread; a harness may hang up right after the chunk with `finish_reason`, before the usage chunk and
    `[DONE]`. Either close may come as a reset. The harness read the answer and acted on it: its next request carries
    that turn (trimmed at its stop word, as smolagents sends it back), so the call is recorded and trained. One
    whose harness asks the same prompt again instead, and never goes on from it, is still left out."""
    episode = gateway.open_episode()
    url = httpx.URL(f"{episode.base_url}/chat/completions")
    stop = ["Observation:", "Calling tools:"]
    forced = "I will look it up. Observation: none"  # the policy's text, cut by the engine at the stop word
    task = [{"role": "user", "content": "Find the answer."}]

    def unread(sock: socket.socket) -> bytes:
        try:
            return sock.recv(1 << 16, socket.MSG_PEEK)
        except BlockingIOError:
            return b""

    async def hang_up_after_finish(messages: list) -> str:
        """Read the stream byte by byte up to the end of the event with `finish_reason`, and close with the rest
        (the usage chunk, `[DONE]`, the end of the chunked body) arrived but unread: TCP resets the connection."""
        body = json.dumps({"model": "policy", "messages": messages, "max_tokens": 40, "stream": True, "stop": stop,
                           "stream_options": {"include_usage": True},
                           "structured_outputs": {"regex": literal(forced)}}).encode()
        loop = asyncio.get_running_loop()
        with socket.create_connection((url.host, url.port)) as sock:
            sock.setblocking(False)
            await loop.sock_sendall(sock, (
                f"POST {url.path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            read = b""
            async with asyncio.timeout(IDLE_DEADLINE_S):
                while b'"finish_reason":"' not in read or not read.endswith(b"\n\n"):
                    read += await loop.sock_recv(sock, 1)
                while not unread(sock).endswith(b"0\r\n\r\n"):
                    await asyncio.sleep(0.01)  # until the rest is in, unread
        await closed_on_the_gateway(url.port)
        events = [json.loads(line[len("data: "):]) for line in read.decode().splitlines() if line.startswith("data: {")]
        return "".join(event["choices"][0]["delta"].get("content") or "" for event in events)

    async def ask(messages: list) -> str:
        async with httpx.AsyncClient(timeout=120) as http:
            response = await http.post(url, json={"model": "policy", "messages": messages, "max_tokens": 4,
                                                  "stop": stop})
        await closed_on_the_gateway(url.port)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    read = await hang_up_after_finish(task)
    assert read == "I will look it up. "  # cut before the stop word by the engine
    (hung_up,) = episode.client.episode.calls  # recorded once its finish was written, not only after [DONE]
    trimmed = {"role": "assistant", "content": read.strip()}  # smolagents strips what it sends back
    await ask([*task, trimmed, {"role": "user", "content": "Observation:\nnone"}])
    assert list(episode.client.trajectory(1.0).calls)[0] is hung_up  # the turn the harness acted on is trained

    again = [{"role": "user", "content": "Find another answer."}]
    await hang_up_after_finish(again)  # hung up on, then the same prompt again: the harness did not use it
    ignored = episode.client.episode.calls[-1]
    answer = await ask(again)
    went_on_from = episode.client.episode.calls[-1]
    await ask([*again, {"role": "assistant", "content": answer}, {"role": "user", "content": "More."}])
    trained = list(episode.client.trajectory(1.0).calls)
    assert ignored.prompt_ids == went_on_from.prompt_ids and ignored not in trained and went_on_from in trained
    assert hung_up in trained
    gateway.close_episode(episode)
