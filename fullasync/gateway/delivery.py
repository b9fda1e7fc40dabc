"""What the gateway hands a harness, and what an episode records of it: a call counts only when delivered.

Owns: `Production`, the work of one completion request (the client's call and, for a stream, its chunks), run
in a task of its own and shared with the retries of its request (the same body bytes after its connection was
gone, or the same `Idempotency-Key` header); `Deliveries`, each episode's productions.

The rules (DESIGN.md, "What is recorded"):
- The call's record is held (`RolloutClient.hold`) until a harness received the response: the JSON body, or the
  stream's chunk that makes the answer whole (its finish; `Answer.whole_at`), was written to a connection still
  open. Only then it joins the episode's trajectory (and the turns a later request may extend). Should that
  connection then end in a reset before its next request, right after a JSON body, its client never read the
  answer (`fullasync.gateway.http.Connection`): the record leaves the episode again, counted as an unread call, and
  an identical request is its retry, to join it. Should it close cleanly at once instead (within `DOUBT_WINDOW_S`),
  or a stream's connection end in a reset (its client may have read the answer and closed with what follows it
  unread: the usage chunk, `[DONE]`, the end of the chunked body — the sync openai SDK stops at `[DONE]`), the
  answer may have been read or thrown away unread (HTTP cannot tell): the call is doubtful, and is not trained when
  the harness then asks the same prompt again without going on from it (`Episode.settled_calls`).
- The openai SDK's retries say so (`x-stainless-retry-count` >= 1): its try before got no answer it returned. When
  that try's answer was written and its connection then closed before another request on it (the SDK's timer
  fired as the answer came in: read off the socket, thrown away), the retry is handed that same answer — one
  sample, one record, now received. Any other identical request after a delivered one is a new sample.
- A harness that disconnects does not stop the work at once: a retry (the openai SDK's comes ~0.5 s later)
  within `ABANDON_GRACE_S` joins it and gets the one completion. When nobody is waiting after that grace, the
  work is cancelled — the engine request aborted — and whatever it produced is forgotten, counted as an
  abandoned call. So the engine is idle within a second of the last disconnect.
- A request identical to one whose connections are all still open is sampled on its own and recorded on its own:
  a harness that samples candidates in parallel (best-of-n, self-consistency, tree search) gets independent
  samples. Only a request whose connection is gone is a retry's to join (the openai SDK sends no idempotency
  key), or any request with the same `Idempotency-Key` header (delivered or not: the same key, the same answer).
  `join_retries=False` joins by the header only.
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
from fullasync.gateway.http import Connection
from fullasync.infra.offload import loop_time

log = logging.getLogger("fullasync")

ABANDON_GRACE_S = 0.75  # a request nobody waits for keeps running this long for a retry to join, then stops
# a clean close this soon after the answer was written leaves it in doubt (an SDK giving up as it came in closes at
# once); a connection its client kept open longer (idle in its pool until our keep-alive timeout, say) was read
DOUBT_WINDOW_S = 2.0
KEPT_DELIVERED = 8  # delivered answers an episode keeps for a retry that says its try got none (the newest)


@dataclass
class Answer:
    """What a production produced: the status and the body (one JSON text, or SSE chunks as they come)."""

    status: int = 200
    chunks: list[bytes] = field(default_factory=list)
    finished: bool = False
    delivered: bool = False
    # how many of the chunks hold the whole answer: up to the first one produced after its calls were recorded (a
    # JSON body; a stream's chunk with the finish, all it says before coming after it); None while unknown
    whole_at: int | None = None


class Production:
    """One request's work, run by `produce(held)` in a task; subscribers read its answer."""

    def __init__(self, key: str, request_key: str, client: RolloutClient,
                 produce: Callable[[Production], Awaitable[None]], on_idle: Callable[[Production], None],
                 on_unread: Callable[[Production], None] = lambda production: None) -> None:
        self.key = key
        self.request_key = request_key
        self.answer = Answer()
        self.subscribers = 0
        self.orphaned = False  # every connection that read it is gone: a retry may take it over
        self.closed_unsettled = False  # delivered, then its connection closed before another request on it
        self.unread = False  # delivered, then its connection was reset: not received, not recorded
        self.held: HeldCalls | None = None
        self._written_to: Connection | None = None  # the connection its answer was written to last
        self._written_at = 0.0  # when (the event loop's clock)
        self._trailing = False  # more followed the answer on that connection (a stream's last events)
        self._client = client
        self._changed = asyncio.Event()
        self._on_idle = on_idle
        self._on_unread = on_unread
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
        if self.answer.whole_at is None and self.held is not None and self.held.calls:
            self.answer.whole_at = len(self.answer.chunks)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        """Until the answer changes (awaited directly: the event is read before anything else runs)."""
        await self._changed.wait()

    def delivered(self, connection: Connection | None, trailing: bool = False) -> None:
        """The whole answer was written to `connection` (None: a connection nobody tracks, taken as open): when it
        is still open, its record joins the episode, and leaves again should the connection end in a reset before
        its next request (the answer was not read) — unless `trailing`: more follows the answer on the connection
        (a stream's last events, the end of its chunked body), which a client that read the answer may leave unread
        as it closes, so that a reset then leaves the answer in doubt, as a clean close does."""
        if connection is not None and not connection.open:
            return  # the server drops what is written to a closed connection
        self.answer.delivered = True
        if (self.answer.finished or self.answer.whole_at is not None) and self.held is not None:
            self.held.commit()
            self.held.doubt(False)  # its connection decides again
        self.unread = self.closed_unsettled = False
        self._trailing = trailing
        self._written_to, self._written_at = connection, loop_time()
        if connection is not None:
            connection.watch(partial(self._connection_ended, connection))
        if self.subscribers == 0:
            self._stop_expiry()
            self._on_idle(self)

    def _connection_ended(self, connection: Connection, reset: bool) -> None:
        """The connection it was written to ended before another request: unread when reset right after the answer,
        doubtful when closed, or reset with more after the answer (`Episode.settled_calls`). Only the connection it
        was written to last decides (a retry's, if one took it)."""
        if connection is not self._written_to:
            return
        self.closed_unsettled = True
        unread = reset and not self._trailing
        soon = loop_time() - self._written_at <= DOUBT_WINDOW_S
        if self.held is not None and self.answer.delivered and not unread and soon:
            self.held.doubt(True)
        if unread and self.answer.delivered:
            self.answer.delivered, self.unread = False, True
            if self.held is not None:
                self.held.retract()
            self._on_unread(self)

    def _stop_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def subscribe(self) -> None:
        self.subscribers += 1
        self._stop_expiry()

    def unsubscribe(self) -> None:
        self.subscribers -= 1
        if self.subscribers == 0:
            self.orphaned = True
            if self.answer.delivered:
                self._on_idle(self)
            else:
                self._expiry = asyncio.get_running_loop().call_later(ABANDON_GRACE_S, self._on_idle, self)

    async def json(self, disconnected: Callable[[], Awaitable[None]]) -> Answer | None:
        """The whole answer once finished, or None when the connection closed first (`disconnected()` returned);
        delivered once written (`delivered`)."""
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
            return self.answer
        finally:
            gone.cancel()
            self.unsubscribe()

    async def stream(self, connection: Connection | None) -> AsyncIterator[bytes]:
        """Every chunk, from the first, as produced; delivered once the consumer took the chunk that makes the
        answer whole (`Answer.whole_at`; it asks for the next chunk only after writing the previous one to
        `connection`), not only after the last: a harness may hang up once it has the finish, before the usage
        chunk and `[DONE]`. One that never becomes whole (failed in the stream) is delivered at its end."""
        self.subscribe()
        sent = 0
        handed = False
        try:
            while True:
                while sent < len(self.answer.chunks):
                    yield self.answer.chunks[sent]
                    sent += 1
                    if sent == self.answer.whole_at:
                        handed = True
                        self.delivered(connection, trailing=True)
                if self.answer.finished:
                    break
                await self.changed()
            if not handed:
                self.delivered(connection, trailing=True)
        finally:
            self.unsubscribe()


class Deliveries:
    """The productions of one gateway's episodes, by episode key and request key; counts what was abandoned."""

    def __init__(self, join_retries: bool = True) -> None:
        self.join_retries = join_retries
        self.abandoned_calls = 0  # requests whose work nobody received (cancelled, or finished undelivered)
        self.ended_calls = 0  # requests still running when their episode ended (its harness is stopped with it)
        self.joined_requests = 0  # retries that joined the work they repeat instead of generating again
        self.unread_calls = 0  # answers written to a connection its client then reset unread: not recorded
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
                   produce: Callable[[Production], Awaitable[None]], sdk_retry: bool = False) -> Production:
        """The production this request retries in this episode (running, abandoned or unread; or, for an SDK's
        retry, delivered to a connection that then closed), else a new one."""
        episode = self._productions.setdefault(episode_key, {})
        retried_by = partial(self._retried_by, request_key, sdk_retry)
        if existing := next(filter(retried_by, reversed(episode.values())), None):
            self.joined_requests += 1
            return existing
        key = f"{request_key}#{next(self._serial)}"
        production = Production(key, request_key, client, produce, lambda done: self._idle(episode_key, done),
                                self._unread)
        episode[key] = production
        return production

    def _unread(self, production: Production) -> None:
        self.unread_calls += 1
        log.info("gateway: an answer its client reset the connection on unread is not recorded (%d so far)",
                 self.unread_calls)

    def running(self, episode_key: str) -> int:
        """The episode's productions not delivered yet: running, or waiting for a retry."""
        return sum(not (p.answer.delivered or p.unread) for p in self._productions.get(episode_key, {}).values())

    def _retried_by(self, request_key: str, sdk_retry: bool, production: Production) -> bool:
        """Whether a request of `request_key` is a retry of `production`: the same key, not failed, and the same
        `Idempotency-Key`, or the same bytes after every connection to it closed — undelivered, or delivered when the
        request is an SDK's retry and that connection closed before another request."""
        if production.request_key != request_key or production.failed:
            return False
        if request_key.startswith("key:"):
            return True
        if not self.join_retries or not production.orphaned or production.subscribers:
            return False
        return not production.answer.delivered or (sdk_retry and production.closed_unsettled)

    def _idle(self, episode_key: str, production: Production, episode_ended: bool = False) -> None:
        """Nobody waits for `production` any more (after the grace, when undelivered), or its episode ended: stop
        and forget it. A delivered one is kept for a retry (`KEPT_DELIVERED`, the newest), until its episode ends."""
        episode = self._productions.get(episode_key, {})
        if production.answer.delivered and not episode_ended:
            kept = [p for p in episode.values() if p.answer.delivered or p.unread]
            for old in kept[:max(0, len(kept) - KEPT_DELIVERED)]:
                del episode[old.key]
            return
        if episode.get(production.key) is production:
            del episode[production.key]
        if not episode:
            self._productions.pop(episode_key, None)
        if not production.answer.delivered and not production.failed and not production.unread:
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
            if production.answer.delivered or production.unread:
                continue
            production.subscribers = 0
            self._idle(episode_key, production, episode_ended=True)
        self._productions.pop(episode_key, None)
