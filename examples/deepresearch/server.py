"""The retrieval service over HTTP, and the client the agent uses to reach it.

Owns: a FastAPI app serving any `Retriever` (`POST /retrieve {query, top_k}` → ranked hits,
`POST /open {doc_id}` → the document or 404, `GET /health`), `RetrievalServer` which runs it with
uvicorn on loopback inside the caller's event loop, and `HttpRetriever`, the same `Retriever`
interface over HTTP with a per-request timeout and retries (connection errors, timeouts, 5xx; a 4xx
is the caller's mistake and is raised at once). A user with a dense retriever serves the same two
routes and points `retrieval.url` at it.

    python -m examples.deepresearch.server --port 8090      # serves the generated corpus on 127.0.0.1
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, Field

from examples.deepresearch.retrieval import Retriever, SearchHit
from examples.deepresearch.world import Document
from fullasync.gateway.http import ServedApp

MAX_TOP_K = 100


class RetrieveRequest(BaseModel):
    query: str
    top_k: int = Field(default=5, ge=1, le=MAX_TOP_K)


class OpenRequest(BaseModel):
    doc_id: str


class RetrievalError(RuntimeError):
    """The retrieval service could not answer (after retries) or refused the request."""


def build_app(retriever: Retriever) -> Any:
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="deepresearch retrieval")

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> dict[str, Any]:
        hits = await retriever.search(request.query, request.top_k)
        return {"results": [asdict(hit) for hit in hits]}

    @app.post("/open")
    async def open_document(request: OpenRequest) -> dict[str, Any]:
        document = await retriever.open(request.doc_id)
        if document is None:
            raise HTTPException(status_code=404, detail=f"no document with id {request.doc_id!r}")
        return asdict(document)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


class RetrievalServer(ServedApp):
    """`await start()` serves `retriever` on host:port (0 = any free port); `url`; `await stop()`."""

    def __init__(self, retriever: Retriever, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(build_app(retriever), "retrieval-server", host, port)
        self.retriever = retriever


@dataclass(frozen=True)
class HttpRetrieverConfig:
    timeout_s: float = 10.0  # per request
    retries: int = 3  # further attempts after a connection error, timeout or 5xx
    backoff_s: float = 0.2  # first wait between attempts; doubles each time


class HttpRetriever:
    """The `Retriever` interface over a retrieval service's HTTP routes."""

    def __init__(self, url: str, config: HttpRetrieverConfig = HttpRetrieverConfig()) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.config = config
        self._http = httpx.AsyncClient(timeout=config.timeout_s)

    async def _post(self, route: str, body: dict[str, Any]) -> Any:
        import httpx

        delay, last_error = self.config.backoff_s, ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            try:
                response = await self._http.post(self.url + route, json=body)
            except httpx.TransportError as error:  # connect errors and timeouts: retry
                last_error = f"{type(error).__name__}: {error}"
                continue
            if response.status_code >= 500:
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            return response
        raise RetrievalError(f"{self.url}{route} failed after {self.config.retries + 1} attempts: {last_error}")

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        response = await self._post("/retrieve", {"query": query, "top_k": top_k})
        if response.status_code != 200:
            raise RetrievalError(f"/retrieve refused the request (HTTP {response.status_code}): {response.text[:200]}")
        return [SearchHit(**hit) for hit in response.json()["results"]]

    async def open(self, doc_id: str) -> Document | None:
        response = await self._post("/open", {"doc_id": doc_id})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise RetrievalError(f"/open refused the request (HTTP {response.status_code}): {response.text[:200]}")
        return Document(**response.json())

    async def aclose(self) -> None:
        await self._http.aclose()


async def _serve(args: argparse.Namespace) -> None:
    from examples.deepresearch.data import load_corpus
    from examples.deepresearch.retrieval import Bm25Index
    from examples.deepresearch.world import WorldSpec, ensure_world

    corpus = args.corpus or str(ensure_world(WorldSpec()) / "corpus.jsonl")
    server = RetrievalServer(Bm25Index(load_corpus(corpus), snippet_words=args.snippet_words), args.host, args.port)
    await server.start()
    print(f"[deepresearch] serving {corpus} at {server.url}/retrieve", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a BM25 index of a JSONL corpus over HTTP (loopback).")
    parser.add_argument("--corpus", default="", help="JSONL corpus (default: the generated world's)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--snippet-words", type=int, default=12)
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
