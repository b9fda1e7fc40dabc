"""examples/deepresearch retrieval: the HTTP service returns exactly the in-process ranking; its
client retries and times out; tool failures become recorded errors, never exceptions."""

from __future__ import annotations

import asyncio

import pytest

from examples.deepresearch.retrieval import Bm25Index
from examples.deepresearch.server import HttpRetriever, HttpRetrieverConfig, RetrievalError, RetrievalServer
from examples.deepresearch.tools import ResearchTools
from examples.deepresearch.world import WorldSpec, documents, generate_world, questions

FAST = HttpRetrieverConfig(timeout_s=0.5, retries=2, backoff_s=0.01)  # against services that never answer
SERVED = HttpRetrieverConfig(timeout_s=30, retries=2, backoff_s=0.01)  # against live ones: a bound on a hang


@pytest.fixture(scope="module")
def world():
    return generate_world(WorldSpec())


@pytest.fixture(scope="module")
def index(world):
    return Bm25Index(documents(world))


@pytest.fixture
async def served(index):
    server = RetrievalServer(index)
    await server.start()
    client = HttpRetriever(server.url, SERVED)
    yield server, client
    await client.aclose()
    await server.stop()


async def test_http_service_and_in_process_index_give_the_same_ranking(world, index, served):
    server, client = served
    assert server.host == "127.0.0.1"
    rows = questions(world)[::400]
    for query in [r["question"] for r in rows] + [q for r in rows for q in r["search_queries"]] + ["", "zzz"]:
        for top_k in (1, 5):
            assert await client.search(query, top_k) == index.search_now(query, top_k), query
    doc_id = rows[0]["gold_doc_ids"][0]
    assert await client.open(doc_id) == index.open_now(doc_id)
    assert await client.open("no-such-doc") is None


async def test_client_retries_a_failing_service(index):
    class FailsOnce:
        calls = 0

        async def search(self, query, top_k):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("index warming up")
            return await index.search(query, top_k)

        async def open(self, doc_id):
            return await index.open(doc_id)

    flaky = FailsOnce()
    server = RetrievalServer(flaky)
    await server.start()
    client = HttpRetriever(server.url, SERVED)
    try:
        hits = await client.search("kaqui taskaka", 2)
    finally:
        await client.aclose()
        await server.stop()
    assert flaky.calls == 2 and hits == index.search_now("kaqui taskaka", 2)


async def test_client_gives_up_on_a_dead_or_silent_service():
    accepted = []
    silent = await asyncio.start_server(lambda reader, writer: accepted.append(writer), "127.0.0.1", 0)  # never answers
    port = silent.sockets[0].getsockname()[1]
    client = HttpRetriever(f"http://127.0.0.1:{port}", FAST)
    with pytest.raises(RetrievalError, match="after 3 attempts.*Timeout"):
        await asyncio.wait_for(client.search("x", 1), 60)  # a bound on a hang: the client gives up by itself
    assert len(accepted) == 3  # each attempt connected, then timed out waiting for an answer
    for writer in accepted:
        writer.close()
    silent.close()
    await silent.wait_closed()
    with pytest.raises(RetrievalError, match="after 3 attempts"):
        await client.search("x", 1)  # nothing listens any more
    await client.aclose()


async def test_bad_top_k_is_refused_without_retrying(served):
    _, client = served
    with pytest.raises(RetrievalError, match="HTTP 422"):
        await client.search("x", 0)


async def test_tool_errors_are_outcomes_not_exceptions(index):
    tools = ResearchTools(index, top_k=2, enabled=("search", "open"))
    ok = await tools.run("search", '{"query": "Kaqui  Taskaka"}')
    assert ok.error is None and ok.query == "kaqui taskaka" and ok.content.startswith("[p0] kaqui taskaka")
    assert (await tools.run("open", '{"doc_id": "p0"}')).content == index.open_now("p0").text
    for name, arguments, message in [
        ("browse", '{"query": "x"}', "unknown tool 'browse'"),
        ("search", '{"query": ', "not valid JSON"),
        ("search", '["x"]', "must be a JSON object"),
        ("search", '{"q": "x"}', "needs a non-empty string 'query'"),
        ("open", '{"doc_id": "nope"}', "no document with id 'nope'"),
    ]:
        outcome = await tools.run(name, arguments)
        assert outcome.error is not None and message in outcome.error
        assert outcome.content.startswith("error: ")
    down = ResearchTools(HttpRetriever("http://127.0.0.1:9", FAST), top_k=2)
    outcome = await down.run("search", '{"query": "x"}')
    assert "RetrievalError" in outcome.error
    await down.retriever.aclose()
