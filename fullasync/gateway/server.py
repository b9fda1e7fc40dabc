"""The OpenAI-compatible HTTP gateway: one base URL per episode, in front of the token-exact client.

Owns: the map from an episode's unguessable key to its `RolloutClient`, the episodes' lifetimes, and serving
the routes (`routes.py`: `/sessions/{key}/v1/chat/completions`, `/sessions/{key}/v1/completions`,
`/sessions/{key}/v1/models`, `/v1/models`; error bodies and SSE in `wire.py`). Binds loopback by default. Runs in
the caller's event loop (uvicorn as a task), so requests share the loop with the rollouter.
Does not own: generation, recording or continuation — the client does all of that, identically
for in-process and HTTP harnesses — nor when a call counts as delivered (`delivery`).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

from fullasync.client import RolloutClient, RolloutService
from fullasync.gateway.delivery import Deliveries
from fullasync.gateway.http import ServedApp, http_url
from fullasync.gateway.routes import build_app


@dataclass(frozen=True)
class GatewayEpisode:
    """What a harness needs to talk to one episode over HTTP."""

    episode_id: str
    base_url: str  # e.g. http://127.0.0.1:PORT/sessions/KEY/v1 — pass as the OpenAI base URL
    api_key: str  # the episode key; harnesses may send it as the bearer token
    client: RolloutClient  # the same episode in-process (its recorded calls make the trajectory)


class Gateway:
    """Start with `await start()`; `open_episode()` per episode; `close_episode()`; `await stop()`."""

    def __init__(self, service: RolloutService, host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = 8 * 2**20, join_retries: bool = True,
                 untrained_models: Collection[str] = ()) -> None:
        """`join_retries`: a request identical to one of the same episode whose connection is gone (running, or
        abandoned moments ago) joins it instead of sampling again; identical requests on open connections are
        sampled independently (`fullasync.gateway.delivery`). `untrained_models`: model names besides the policy's
        that requests may name (a harness's background model: Claude Code's titles and command checks); the policy
        answers them, and they are neither recorded nor trained, only counted (`untrained_calls`)."""
        self.service = service
        self.untrained_models = frozenset(untrained_models)
        self.untrained_calls = 0
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.answered: Counter[int] = Counter()  # completion requests answered, by HTTP status
        self.deliveries = Deliveries(join_retries)
        self._episodes: dict[str, GatewayEpisode] = {}
        self._finished: set[str] = set()
        self._http: ServedApp | None = None

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    @property
    def run_base_url(self) -> str:
        """The one base URL for every episode of the run: each request names its episode in the X-Session-ID
        header (its `GatewayEpisode.api_key`), so a harness keeps one HTTP client for the whole run."""
        return f"{self.url}/v1"

    async def start(self) -> None:
        self._http = ServedApp(build_app(self), "gateway", self.host, self.port, timeout_keep_alive=30)
        await self._http.start()
        self.port = self._http.port

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.stop()
            self._http = None

    def open_episode(self, episode_id: str | None = None, client: RolloutClient | None = None) -> GatewayEpisode:
        """A new episode (or `client`'s) reachable at its own base URL until `close_episode`."""
        key = secrets.token_urlsafe(24)
        client = client if client is not None else self.service.client(episode_id)
        episode = GatewayEpisode(client.episode.id, f"{self.url}/sessions/{key}/v1", key, client)
        self._episodes[key] = episode
        return episode

    def close_episode(self, episode: GatewayEpisode) -> None:
        """Later requests for it get 404 'finished'; its recorded calls stay on `episode.client`."""
        if self._episodes.pop(episode.api_key, None) is not None:
            self._finished.add(episode.api_key)
            self.deliveries.close_episode(episode.api_key)
            episode.client.close()

    def stats(self) -> dict[str, float]:
        """Cumulative counts for the step metrics: calls nobody received, calls cut short because their episode
        ended, answers written to a connection its client then reset unread, requests that joined an identical
        one."""
        return {"gateway/abandoned_calls": float(self.deliveries.abandoned_calls),
                "gateway/ended_calls": float(self.deliveries.ended_calls),
                "gateway/unread_calls": float(self.deliveries.unread_calls),
                "gateway/joined_requests": float(self.deliveries.joined_requests),
                "gateway/untrained_calls": float(self.untrained_calls)}

    def lookup(self, key: str) -> GatewayEpisode:
        episode = self._episodes.get(key)
        if episode is None:
            state = "has finished" if key in self._finished else "is unknown"
            raise LookupError(f"episode {state}: use the base URL the rollouter gave this episode, while it runs")
        return episode
