"""The agent's tools as OpenAI function tools: `search(query)` and `open(doc_id)` over a `Retriever`.

Owns: the tool schemas the model sees, running one tool call from its name and JSON arguments, and
the text fed back to the model. A failing call (unknown tool, bad arguments, a retrieval service
that is down) becomes a `ToolOutcome` with `error` set and an `error: ...` text for the model: tool
errors are recorded, they never end the episode. Does not own: retrieval itself or the turn loop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from examples.deepresearch.retrieval import Retriever, SearchHit

SCHEMAS: dict[str, dict[str, Any]] = {
    "search": {"type": "function", "function": {
        "name": "search", "description": "Search the documents.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    "open": {"type": "function", "function": {
        "name": "open", "description": "Read a document by id.",
        "parameters": {"type": "object", "properties": {"doc_id": {"type": "string"}}, "required": ["doc_id"]}}},
}


@dataclass(frozen=True)
class ToolOutcome:
    """One executed tool call: what was asked, what the model is told, and the error if it failed."""

    name: str
    arguments: str  # the JSON text the model wrote
    content: str  # fed back as the tool message
    error: str | None = None
    query: str | None = None  # the normalised query of a search (to spot duplicates)


def format_hits(hits: Sequence[SearchHit]) -> str:
    """Search results as the model reads them: one `[doc_id] snippet` line per hit, best first."""
    if not hits:
        return "no results"
    return "\n".join(f"[{hit.doc_id}] {hit.snippet}" for hit in hits)


def normalize_query(query: str) -> str:
    return " ".join(query.lower().split())


class ResearchTools:
    """The enabled tools over `retriever`; `run(name, arguments)` never raises for a bad call."""

    def __init__(self, retriever: Retriever, top_k: int = 3, enabled: Sequence[str] = ("search", "open")) -> None:
        unknown = sorted(set(enabled) - set(SCHEMAS))
        if unknown or not enabled:
            raise ValueError(f"agent.tools={list(enabled)} must be a non-empty subset of {sorted(SCHEMAS)}")
        if top_k < 1:
            raise ValueError(f"agent.top_k={top_k} must be >= 1")
        self.retriever = retriever
        self.top_k = top_k
        self.enabled = tuple(enabled)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [SCHEMAS[name] for name in self.enabled]

    async def run(self, name: str, arguments: str) -> ToolOutcome:
        if name not in self.enabled:
            return self._failed(name, arguments, f"unknown tool {name!r}; available: {list(self.enabled)}")
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError as error:
            return self._failed(name, arguments, f"arguments are not valid JSON ({error.msg})")
        if not isinstance(parsed, dict):
            return self._failed(name, arguments, "arguments must be a JSON object")
        field = "query" if name == "search" else "doc_id"
        value = parsed.get(field)
        if not isinstance(value, str) or not value.strip():
            return self._failed(name, arguments, f"{name} needs a non-empty string '{field}'")
        try:
            if name == "search":
                hits = await self.retriever.search(value, self.top_k)
                return ToolOutcome(name, arguments, format_hits(hits), query=normalize_query(value))
            document = await self.retriever.open(value.strip())
        except Exception as error:  # the service failed: the model is told, the episode goes on
            return self._failed(name, arguments, f"{type(error).__name__}: {error}")
        if document is None:
            return self._failed(name, arguments, f"no document with id {value!r}")
        return ToolOutcome(name, arguments, document.text)

    @staticmethod
    def _failed(name: str, arguments: str, error: str) -> ToolOutcome:
        return ToolOutcome(name, arguments, f"error: {error}", error=error)
