"""The gateway's shared productions (fullasync.gateway.delivery) under the orderings the event loop may choose:
a waiter that starts after its production finished still gets the answer (a lost wake-up here once hung every
JSON request whose work finished before its waiter ran)."""

from __future__ import annotations

import asyncio

from fullasync.client import ClientConfig, RolloutService
from fullasync.gateway.delivery import Deliveries
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer

COST = DecodeCost(step_base_s=1e-4, step_per_seq_s=0.0, max_num_seqs=16, push_s=1e-3)


def test_a_production_that_finishes_before_its_waiter_starts_is_still_answered():
    async def main():
        service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(), ClientConfig(model_name="policy"))
        deliveries = Deliveries()

        async def produce(production) -> None:  # finishes in its first step, before the waiter's task runs
            production.add(b'{"answer": 42}')

        never = asyncio.Event()
        production = deliveries.production("episode", service.client("e"), "key", produce)
        async with asyncio.timeout(5.0):  # in this task, as the gateway's route awaits it (no task in between)
            answer = await production.json(never.wait)
        production.delivered(None)  # the route wrote it
        return answer, deliveries

    answer, deliveries = run_virtual(main)
    assert answer is not None and answer.chunks == [b'{"answer": 42}'] and answer.delivered
    assert deliveries.abandoned_calls == 0


def test_a_request_still_running_when_its_episode_ends_is_stopped_counted_as_ended_and_answered_empty():
    async def main():
        service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(), ClientConfig(model_name="policy"))
        deliveries = Deliveries()
        started = asyncio.Event()

        async def produce(production) -> None:  # the harness's call, still generating when the episode ends
            started.set()
            await asyncio.Event().wait()

        never = asyncio.Event()
        production = deliveries.production("episode", service.client("e"), "key", produce)
        waiter = asyncio.ensure_future(production.json(never.wait))
        await started.wait()
        deliveries.close_episode("episode")  # the row was stopped: its harness and its requests go with it
        async with asyncio.timeout(5.0):
            answer = await waiter
        return answer, production, deliveries

    answer, production, deliveries = run_virtual(main)
    assert answer is not None and answer.finished and answer.chunks == []  # the route answers "episode ended"
    assert production.task.cancelled()
    assert (deliveries.ended_calls, deliveries.abandoned_calls) == (1, 0)  # not a call a harness walked away from


def test_requests_are_the_same_by_their_idempotency_key_else_by_their_bytes():
    body = b'{"model": "policy", "messages": [{"role": "user", "content": "hi"}]}'
    key = Deliveries.request_key
    assert key("chat", body, False, None) == key("chat", bytes(body), False, None)  # a retry sends the same bytes
    assert key("chat", body, False, None) != key("chat", body.replace(b"hi", b"ho"), False, None)
    assert key("chat", body, False, None) != key("completions", body, False, None)
    # the header decides alone, but a streamed and a JSON request are never one production
    assert key("chat", body, False, "k1") == key("chat", b"{}", False, "k1") != key("chat", body, True, "k1")
    assert key("chat", body, False, "k1") != key("chat", body, False, None)


def test_only_a_retry_joins_identical_requests_on_open_connections_are_sampled_apart():
    async def main():
        service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(), ClientConfig(model_name="policy"))
        deliveries = Deliveries()
        release = asyncio.Event()

        async def produce(production) -> None:  # a call still generating while the others arrive
            await release.wait()
            production.add(b'{"answer": 42}')

        body = Deliveries.request_key("chat", b"{}", False, None)
        keyed = Deliveries.request_key("chat", b"{}", False, "k")
        first = deliveries.production("episode", service.client("e"), body, produce)
        hang_up = asyncio.Event()
        first_waiter = asyncio.ensure_future(first.json(hang_up.wait))
        await asyncio.sleep(0)  # its connection is open
        parallel = deliveries.production("episode", service.client("e"), body, produce)
        hang_up.set()  # the first harness's connection drops (its SDK timed out)
        assert await first_waiter is None
        retry = deliveries.production("episode", service.client("e"), body, produce)
        same_key = [deliveries.production("episode", service.client("e"), keyed, produce) for _ in range(2)]
        return first, parallel, retry, same_key, deliveries

    first, parallel, retry, same_key, deliveries = run_virtual(main)
    assert parallel is not first  # its connection was open: sampled on its own
    assert retry is first  # its connection was gone: the retry takes it over
    assert same_key[0] is same_key[1] is not first  # the Idempotency-Key joins whatever the connections
    assert deliveries.joined_requests == 2

    async def without_retries():
        deliveries = Deliveries(join_retries=False)
        service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(), ClientConfig(model_name="policy"))
        key = Deliveries.request_key("chat", b"{}", False, None)

        async def produce(production) -> None:
            await asyncio.Event().wait()

        first = deliveries.production("episode", service.client("e"), key, produce)
        await first.json(lambda: asyncio.sleep(0))  # a connection that drops at once
        return first is deliveries.production("episode", service.client("e"), key, produce)

    assert run_virtual(without_retries) is False


def test_a_clean_close_right_after_the_answer_leaves_it_in_doubt_one_long_after_does_not():
    """An SDK that gives up as the answer comes in closes at once; a client that keeps its connection idle in its
    pool (until the server's keep-alive timeout closes it) read the answer."""
    from fullasync.gateway.delivery import DOUBT_WINDOW_S
    from fullasync.gateway.http import Connection
    from fullasync.types import FinishReason, ModelCall

    made = ModelCall(prompt_ids=(1,), output_ids=(2,), output_logprobs=(-1.0,), output_versions=(0,),
                     finish_reason=FinishReason.STOP)

    async def main(wait_s: float):
        service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(), ClientConfig(model_name="policy"))
        client = service.client("e")

        async def produce(production) -> None:
            production.held.calls.append(made)  # what the client's call records
            production.add(b'{"answer": 42}')

        production = Deliveries().production("episode", client, "key", produce)
        never = asyncio.Event()
        await production.json(never.wait)
        connection = Connection()
        production.delivered(connection)
        await asyncio.sleep(wait_s)
        connection.lost(None)  # closed cleanly
        return client.episode

    soon = run_virtual(lambda: main(0.01))
    late = run_virtual(lambda: main(DOUBT_WINDOW_S + 5))
    assert soon.calls == [made] and id(made) in soon.doubtful
    assert late.calls == [made] and not late.doubtful


def test_a_stream_is_delivered_with_its_finish_and_a_reset_after_it_leaves_it_in_doubt_not_unread():
    """A harness may hang up once it has the chunk with the finish (smolagents' SDK at `[DONE]`, before the end of
    the chunked body): what follows stays unread, and TCP resets the connection. The answer was read, so the call is
    recorded when its finish was written, and the reset leaves it doubtful (`Episode.settled_calls`), not unread;
    a JSON answer has nothing after it, and a reset there still means it was not read."""
    from fullasync.gateway.http import Connection
    from fullasync.types import FinishReason, ModelCall

    made = ModelCall(prompt_ids=(1,), output_ids=(2,), output_logprobs=(-1.0,), output_versions=(0,),
                     finish_reason=FinishReason.STOP)

    async def main():
        service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(), ClientConfig(model_name="policy"))
        client = service.client("e")
        deliveries = Deliveries()
        rest = asyncio.Event()

        async def produce(production) -> None:
            production.add(b"data: {role}\n\n")
            production.add(b"data: {content}\n\n")
            production.held.calls.append(made)  # the client's chat stream records the call before its finish
            production.add(b"data: {finish}\n\n")
            await rest.wait()
            production.add(b"data: {usage}\n\n")
            production.add(b"data: [DONE]\n\n")

        production = deliveries.production("episode", client, "key", produce)
        await production.started()
        connection = Connection()
        chunks = production.stream(connection)
        read = [await anext(chunks) for _ in range(3)]
        assert client.episode.calls == []  # the finish is being written
        waiting = asyncio.ensure_future(anext(chunks))  # written: the consumer asks for the next chunk
        await asyncio.sleep(0)
        recorded_at_finish = list(client.episode.calls)
        connection.lost(ConnectionResetError())  # the harness hung up, the usage chunk and [DONE] unread
        rest.set()
        assert await waiting == b"data: {usage}\n\n"  # written to a closed connection: dropped by the server
        await chunks.aclose()
        return read, recorded_at_finish, client.episode, deliveries

    read, recorded_at_finish, episode, deliveries = run_virtual(main)
    assert read[-1] == b"data: {finish}\n\n" and recorded_at_finish == [made]
    assert episode.calls == [made] and id(made) in episode.doubtful and deliveries.unread_calls == 0
