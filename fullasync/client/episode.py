"""What one episode's client holds between calls: the calls it made, the turns a later chat call may extend,
the oldest version of its tokens, why its last call failed, and the calls held back until a response is delivered
(`HeldCalls`). Owns no I/O; `RolloutClient` reads and writes it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from fullasync.client.chat_tokens import TurnState
from fullasync.client.continuation import InfraHooks, no_priority
from fullasync.errors import FailureKind
from fullasync.types import ModelCall


class Episode:
    """The calls one episode made, and the turns a later chat call may extend."""

    def __init__(self, episode_id: str) -> None:
        self.id = episode_id
        self.calls: list[ModelCall] = []
        self.turns: list[TurnState] = []
        self.returned: list[dict[str, Any]] = []  # every assistant message answered (to tell echoed policy turns)
        self.last_completion: tuple[str, tuple[int, ...]] | None = None  # (prompt + output text, their ids)
        self.oldest_version: int | None = None  # of any token generated so far, interrupted segments included
        self.logged: list[tuple[str, float]] = []  # the harness's own metrics (`RolloutClient.log`), in order
        # why the last call failed, when the policy or the infrastructure caused it (None after a call succeeds):
        # a harness that then raises anything (an SDK error over HTTP, say) failed for this reason
        self.fault: FailureKind | None = None
        # set by the rollouter: wraps a wait for a dead engine's restart, during which the episode's deadline stops
        self.deadline_paused: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
        # set by the rollouter: the engine priority of the episode's next request (its row's oldest token version)
        self.priority: Callable[[], int] = no_priority

    def infra_hooks(self) -> InfraHooks:
        return InfraHooks(waiting=lambda: self.deadline_paused(), failed=self.infra_failed)

    def infra_failed(self) -> None:
        self.fault = FailureKind.INFRA

    def note_versions(self, versions: tuple[int, ...]) -> None:
        """Versions of a segment's tokens as the engine returns them (the rollouter stops rows by the oldest)."""
        if versions:
            oldest = min(versions)
            self.oldest_version = oldest if self.oldest_version is None else min(oldest, self.oldest_version)


class HeldCalls:
    """What the calls made in one `RolloutClient.hold()` recorded (calls, the turns and completion a later call
    may extend), kept out of the episode until `commit()`: a response the harness never received is not part of
    its trajectory, and the next request is not prefixed by it."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode
        self.calls: list[ModelCall] = []
        self.turns: list[TurnState] | None = None
        self.last_completion: tuple[str, tuple[int, ...]] | None = None
        self.committed = False

    def commit(self) -> None:
        """The responses were delivered: the calls join the episode (once)."""
        if self.committed:
            return
        self.committed = True
        self.episode.calls += self.calls
        if self.turns is not None:
            self.episode.turns = self.turns
        if self.last_completion is not None:
            self.episode.last_completion = self.last_completion
