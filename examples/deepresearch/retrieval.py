"""Retrieval: the `Retriever` interface and its in-process BM25 implementation on SQLite FTS5.

Owns: `search(query, top_k)` → ranked `SearchHit`s (doc id, title, snippet, score) and
`open(doc_id)` → the `Document` or None, over an in-memory FTS5 index ranked by SQLite's own
`bm25()` (standard library; no extra dependency). Ties break by corpus order, so rankings are
deterministic. Does not own: HTTP (`server.py` serves any `Retriever` and provides `HttpRetriever`
with the same interface), nor formatting results for the model (`tools.py`).

Queries are free text from a model: they are reduced to word tokens and OR-ed, so no FTS5 query
syntax from the model can raise.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from examples.deepresearch.world import Document

WORD = re.compile(r"\w+", re.UNICODE)
TITLE_WEIGHT = 2.0  # bm25() column weight of titles against body text (1.0)


@dataclass(frozen=True)
class SearchHit:
    """One ranked result; `score` is BM25 (higher is better)."""

    doc_id: str
    title: str
    snippet: str
    score: float


class Retriever(Protocol):
    """What the agent's tools need; in process (`Bm25Index`) or over HTTP (`HttpRetriever`)."""

    async def search(self, query: str, top_k: int) -> list[SearchHit]: ...

    async def open(self, doc_id: str) -> Document | None: ...


def snippet_of(text: str, words: int) -> str:
    """The first `words` words of `text` (with an ellipsis when cut)."""
    parts = text.split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


def match_expression(query: str) -> str:
    """An FTS5 MATCH expression: the query's word tokens, each quoted, OR-ed ('' when none)."""
    tokens = dict.fromkeys(token.lower() for token in WORD.findall(query))
    return " OR ".join(f'"{token}"' for token in tokens)


class Bm25Index:
    """An in-memory SQLite FTS5 index over `documents`; safe to share across threads and episodes."""

    def __init__(self, documents: Iterable[Document], snippet_words: int = 12) -> None:
        if snippet_words < 1:
            raise ValueError(f"snippet_words={snippet_words} must be >= 1")
        self.snippet_words = snippet_words
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, title, text)")
        rows = [(d.doc_id, d.title, d.text) for d in documents]
        if not rows:
            raise ValueError("the corpus is empty: give Bm25Index at least one document")
        if len({doc_id for doc_id, _, _ in rows}) != len(rows):
            raise ValueError("document ids must be unique in the corpus")
        self._db.executemany("INSERT INTO docs (doc_id, title, text) VALUES (?, ?, ?)", rows)
        self._db.commit()
        self.size = len(rows)

    def search_now(self, query: str, top_k: int) -> list[SearchHit]:
        """Synchronous search (what `search` awaits)."""
        if top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1")
        expression = match_expression(query)
        if not expression:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT doc_id, title, text, bm25(docs, 0.0, ?, 1.0) AS rank FROM docs WHERE docs MATCH ? "
                "ORDER BY rank, rowid LIMIT ?", (TITLE_WEIGHT, expression, top_k)).fetchall()
        return [SearchHit(doc_id, title, snippet_of(text, self.snippet_words), -rank)
                for doc_id, title, text, rank in rows]

    def open_now(self, doc_id: str) -> Document | None:
        with self._lock:
            row = self._db.execute("SELECT doc_id, title, text FROM docs WHERE doc_id = ?", (doc_id,)).fetchone()
        return Document(*row) if row is not None else None

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        return self.search_now(query, top_k)

    async def open(self, doc_id: str) -> Document | None:
        return self.open_now(doc_id)

    def close(self) -> None:
        self._db.close()
