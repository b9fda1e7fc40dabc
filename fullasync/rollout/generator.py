"""The harness contract beyond a plain function: `CustomGenerator`, for set-up/tear-down and out-of-process harnesses.

Owns: the base class and the per-episode context it receives. A plain `async def rollout_fn(client,
row)` needs none of this. A `CustomGenerator` gets, per episode, an `EpisodeContext` with the
in-process `RolloutClient` and — when `uses_gateway` is True — the episode's OpenAI base URL and API
key on the gateway, to hand to a subprocess, container or CLI. Every request through either path is
recorded into the same episode; `generate` returns a reward (the recorded calls become the
trajectory) or a whole `Trajectory`.

    class MyCLIHarness(CustomGenerator):
        uses_gateway = True

        async def generate(self, episode, row):
            proc = await asyncio.create_subprocess_exec(
                "my-agent", "--base-url", episode.base_url, "--api-key", episode.api_key, row["task"])
            return 1.0 if await proc.wait() == 0 else 0.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fullasync.client import RolloutClient
from fullasync.types import Trajectory


@dataclass(frozen=True)
class EpisodeContext:
    """One episode as a generator sees it."""

    episode_id: str
    client: RolloutClient  # in-process, OpenAI-style
    base_url: str | None = None  # OpenAI base URL of this episode on the gateway (uses_gateway=True)
    api_key: str | None = None  # the key that goes with base_url


class CustomGenerator:
    """Subclass and implement `generate`; `setup`/`teardown` run once around the whole run."""

    uses_gateway: bool = False  # True: the rollouter starts the HTTP gateway and fills base_url/api_key

    async def setup(self) -> None:
        """Called once before the first episode (start a sandbox pool, load tools, ...)."""

    async def generate(self, episode: EpisodeContext, row: Any) -> float | Trajectory:
        raise NotImplementedError(f"{type(self).__name__}.generate(episode, row) must be implemented")

    async def teardown(self) -> None:
        """Called once after the last episode, also when the run fails."""
