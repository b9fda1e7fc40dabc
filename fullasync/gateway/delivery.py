"""What the gateway hands a harness, and what an episode records of it: a call counts only when delivered.

Owns: `Production`, the work of one completion request (the client's call and, for a stream, its chunks), run
in a task of its own and shared with the retries of its request (the same body bytes after its connection was
gone, or the same `Idempotency-Key` header); `Deliveries`, each episode's productions.

The rules (DESIGN.md, "What is recorded"):
- The call's record is held (`RolloutClient.hold`) until a harness received the response: the JSON body was
  handed to the server for a connection still open, or a stream's last chunk was written. Only then it joins
  the episode's trajectory (and the turns a later request may extend).
- A harness that disconnects does not stop the work at once: a retry (the openai SDK's comes ~0.5 s later)
  within `ABANDON_GRACE_S` joins it and gets the one completion. When nobody is waiting after that grace, the
  work is cancelled — the engine request aborted — and whatever it produced is forgotten, counted as an
  abandoned call. So the engine is idle within a second of the last disconnect.
- A request identical to one whose connections are all still open is sampled on its own and recorded on its own:
  a harness that samples candidates in parallel (best-of-n, self-consistency, tree search) gets independent
  samples. Only a request whose connection is gone is a retry's to join (the openai SDK sends no idempotency
  key), or any request with the same `Idempotency-Key` header. `join_retries=False` joins by the header only.
Does not own: HTTP parsing and responses (`routes`), the episode map (`server.Gateway`).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from fullasync.client import RolloutClient
from fullasync.client.episode import HeldCalls

log = logging.getLogger("fullasync")

ABANDON_GRACE_S = 0.75  # a request nobody waits for keeps running this long for a retry to join, then stops


@dataclass
class Answer:
    """What a production produced: the status and the body (one JSON text, or SSE chunks as they come)."""

    status: int = 200
    chunks: list[bytes] = field(default_factory=list)
    finished: bool = False
    delivered: bool = False


class Production:
    """One request's work, run by `produce(held)` in a task; subscribers read its answer."""

    def __init__(self, key: str, request_key: str, client: RolloutClient,
                 produce: Callable[[Production], Awaitable[None]], on_idle: Callable[[Production], None]) -> None:
        self.key = key
        self.request_key = request_key
        self.answer = Answer()
        self.subscribers = 0
        self.orphaned = False  # every connection that read it is gone: a retry may take it over
        self.held: HeldCalls | None = None
        self._client = client
        self._changed = asyncio.Event()
        self._on_idle = on_idle
        self._expiry: asyncio.TimerHandle | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(produce), name=f"gateway-request-{key[:12]}")

    async def _run(self, produce: Callable[[Production], Awaitable[None]]) -> None:
        with self._client.hold() as held:
            self.held = held
            try:
                await produce(self)
            finally:
                self.answer.finished = True
                self._notify()

    @property
    def failed(self) -> bool:
        """Answered with an error (nothing recorded; a retry tries again)."""
        return self.answer.status != 200

    async def started(self) -> Answer:
        """The answer once its first chunk (or its end) is there: a stream's status is known then."""
        while not self.answer.chunks and not self.answer.finished:
            await self.changed()
        return self.answer

    def add(self, chunk: bytes, status: int | None = None) -> None:
        if status is not None:
            self.answer.status = status
        self.answer.chunks.append(chunk)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        """Until the answer changes (awaited directly: the event is read before anything else runs)."""
        await self._changed.wait()

    def delivered(self) -> None:
        """A subscriber received the whole answer: its record joins the episode."""
        self.answer.delivered = True
        if self.answer.finished and self.held is not None:
            self.held.commit()

    def subscribe(self) -> None:
        self.subscribers += 1
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def unsubscribe(self) -> None:
        self.subscribers -= 1
        if self.subscribers == 0:
            self.orphaned = True
            if self.answer.delivered:
                self._on_idle(self)
            else:
                self._expiry = asyncio.get_running_loop().call_later(ABANDON_GRACE_S, self._on_idle, self)

    async def json(self, disconnected: Callable[[], Awaitable[None]]) -> Answer | None:
        """The whole answer once finished, or None when the connection closed first (`disconnected()` returned)."""
        self.subscribe()
        gone = asyncio.ensure_future(disconnected())
        try:
            while not self.answer.finished:
                changed = asyncio.ensure_future(self._changed.wait())  # the event now: no change can slip past
                try:
                    done, _ = await asyncio.wait({changed, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if gone in done and not self.answer.finished:
                    return None
            self.delivered()
            return self.answer
        finally:
            gone.cancel()
            self.unsubscribe()

    async def stream(self) -> AsyncIterator[bytes]:
        """Every chunk, from the first, as produced; delivered once the consumer took the last one (it asks for
        the next chunk only after sending the previous)."""
        self.subscribe()
        sent = 0
        try:
            while True:
                while sent < len(self.answer.chunks):
                    yield self.answer.chunks[sent]
                    sent += 1
                if self.answer.finished:
                    break
                await self.changed()
            self.delivered()
        finally:
            self.unsubscribe()


class Deliveries:
    """The productions of one gateway's episodes, by episode key and request key; counts what was abandoned."""

    def __init__(self, join_retries: bool = True) -> None:
        self.join_retries = join_retries
        self.abandoned_calls = 0  # requests whose work nobody received (cancelled, or finished undelivered)
        self.ended_calls = 0  # requests still running when their episode ended (its harness is stopped with it)
        self.joined_requests = 0  # retries that joined the work they repeat instead of generating again
        self._productions: dict[str, dict[str, Production]] = {}
        self._serial = itertools.count()

    @staticmethod
    def request_key(kind: str, raw_body: bytes, stream: bool, idempotency_key: str | None) -> str:
        """Which requests are the same: one `Idempotency-Key`, else the same bytes (an SDK's retry sends its body
        again as it was). The bytes, not the parsed body: a canonical re-serialisation cost 0.65 ms per request at a
        128 KB conversation, the hash of the bytes 0.11 ms."""
        if idempotency_key:
            return f"key:{kind}:{stream}:{idempotency_key}"
        return f"body:{kind}:" + hashlib.sha256(raw_body).hexdigest()

    def production(self, episode_key: str, client: RolloutClient, request_key: str,
                   produce: Callable[[Production], Awaitable[None]]) -> Production:
        """The production this request retries in this episode (running or just abandoned, undelivered), else a
        new one."""
        episode = self._productions.setdefault(episode_key, {})
        if existing := next(filter(partial(self._retried_by, request_key), episode.values()), None):
            self.joined_requests += 1
            return existing
        key = f"{request_key}#{next(self._serial)}"
        production = Production(key, request_key, client, produce, lambda done: self._idle(episode_key, done))
        episode[key] = production
        return production

    def running(self, episode_key: str) -> int:
        """The episode's productions not delivered yet: running, or waiting for a retry."""
        return sum(not p.answer.delivered for p in self._productions.get(episode_key, {}).values())

    def _retried_by(self, request_key: str, production: Production) -> bool:
        """Whether a request of `request_key` is a retry of `production`: the same key, the work not yet delivered
        nor failed, and either the same `Idempotency-Key` or the same bytes after every connection to it closed."""
        if production.request_key != request_key or production.answer.delivered or production.failed:
            return False
        return request_key.startswith("key:") or (self.join_retries and production.orphaned
                                                  and production.subscribers == 0)

    def _idle(self, episode_key: str, production: Production, episode_ended: bool = False) -> None:
        """Nobody waits for `production` any more (after the grace, when undelivered), or its episode ended: stop
        and forget it."""
        episode = self._productions.get(episode_key, {})
        if episode.get(production.key) is production:
            del episode[production.key]
        if not episode:
            self._productions.pop(episode_key, None)
        if not production.answer.delivered and not production.failed:
            if episode_ended:
                self.ended_calls += 1
            else:
                self.abandoned_calls += 1
            production.task.cancel()  # a running call aborts its engine request; a finished one records nothing

    def close_episode(self, episode_key: str) -> None:
        """The episode ended (its harness finished, failed, or was stopped with its row): what it still had running
        or waiting for a retry stops now, counted as ended (not as abandoned by a harness); a request still waiting
        for it is answered that the episode ended."""
        for production in list(self._productions.get(episode_key, {}).values()):
            if production.answer.delivered:
                continue
            production.subscribers = 0
            self._idle(episode_key, production, episode_ended=True)
        self._productions.pop(episode_key, None)
