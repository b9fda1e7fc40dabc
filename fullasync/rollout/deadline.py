"""An episode's deadline that stops while the infrastructure is being repaired.

Owns: `EpisodeDeadline`, around the `asyncio.timeout` of one episode (rollout.episode_timeout_s): `suspended()`
takes the deadline away while a call waits for a dead engine to be restarted and gives back the time that was
left when the wait ends, so time spent waiting for infrastructure does not count against the harness. Waits
may overlap (an episode's calls in parallel): the deadline returns when the last one ends. A wait that outlives its
episode (a gateway request still waiting for an engine when the episode ended) leaves the finished deadline alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class EpisodeDeadline:
    def __init__(self, timeout: asyncio.Timeout) -> None:
        self._timeout = timeout
        self._waits = 0
        self._left = 0.0
        self.over = False  # the episode's timeout scope was left: its deadline can no longer change

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Around the episode inside its timeout: `over` once it is left, however."""
        try:
            yield
        finally:
            self.over = True

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        if self._waits == 0 and not self.over:
            when = self._timeout.when()
            self._left = max(0.0, when - loop.time()) if when is not None else -1.0
            self._timeout.reschedule(None)
        self._waits += 1
        try:
            yield
        finally:
            self._waits -= 1
            if self._waits == 0 and self._left >= 0 and not self.over and not self._timeout.expired():
                self._timeout.reschedule(loop.time() + self._left)
