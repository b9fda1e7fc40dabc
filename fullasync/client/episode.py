"""What one episode's client holds between calls: the calls it made, the turns a later chat call may extend,
the oldest version of its tokens, why its last call failed, and the calls held back until a response is delivered
(`HeldCalls`). Owns no I/O; `RolloutClient` reads and writes it."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager

from fullasync.client.chat_tokens import TurnState
from fullasync.client.continuation import InfraHooks, no_priority
from fullasync.client.wire_types import ChatMessage
from fullasync.errors import FailureKind
from fullasync.types import ModelCall

RECENT_CALLS = 4  # the newest calls a request's prompt is checked against (`Episode.went_on`)


class Episode:
    """The calls one episode made, and the turns a later chat call may extend."""

    def __init__(self, episode_id: str) -> None:
        self.id = episode_id
        self.calls: list[ModelCall] = []
        self.turns: list[TurnState] = []
        self.returned: list[ChatMessage] = []  # every assistant message answered (to tell echoed policy turns)
        self.last_completion: tuple[str, tuple[int, ...]] | None = None  # (prompt + output text, their ids)
        self.oldest_version: int | None = None  # of any token generated so far, interrupted segments included
        self.logged: list[tuple[str, float]] = []  # the harness's own metrics (`RolloutClient.log`), in order
        # calls whose answer's connection closed before another request on it: read, or thrown away unread (an SDK
        # that gave up as the answer came in); HTTP cannot tell (`settled_calls`)
        self.doubtful: dict[int, ModelCall] = {}  # by id (the call held: its id is not reused meanwhile)
        self.went_on_from: dict[int, ModelCall] = {}  # calls a later request went on from: received, never doubtful
        # why the last call failed, when the policy or the infrastructure caused it (None after a call succeeds):
        # a harness that then raises anything (an SDK error over HTTP, say) failed for this reason
        self.fault: FailureKind | None = None
        # set by the rollouter: wraps a wait for a dead engine's restart, during which the episode's deadline stops
        self.deadline_paused: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
        # set by the rollouter: the engine priority of the episode's next request (its row's oldest token version)
        self.priority: Callable[[], int] = no_priority

    def went_on(self, prompt_ids: Sequence[int]) -> None:
        """A request's prompt (answered or not: one past the context still shows what the harness had): the recent
        calls it goes on from (`goes_on_from`) were received."""
        prompt = tuple(prompt_ids)
        for call in self.calls[-RECENT_CALLS:]:
            if id(call) not in self.went_on_from and goes_on_from(prompt, call, self.calls):
                self.went_on_from[id(call)] = call
                self.doubtful.pop(id(call), None)

    def settled_calls(self) -> list[ModelCall]:
        """The calls to train: all, but a doubtful one that a later call asks again (the same prompt) and that no
        later call or request goes on from (`goes_on_from`, `went_on`) — its harness asked again instead of going on
        from it, so it did not use it (and may never have received it)."""
        if not self.doubtful:
            return list(self.calls)
        kept = []
        for index, call in enumerate(self.calls):
            if id(call) in self.doubtful:
                later = range(index + 1, len(self.calls))
                if any(self.calls[j].prompt_ids == call.prompt_ids for j in later) and not any(
                        goes_on_from(self.calls[j].prompt_ids, call, itertools.islice(self.calls, j)) for j in later):
                    continue
            kept.append(call)
        return kept

    def infra_hooks(self) -> InfraHooks:
        return InfraHooks(waiting=lambda: self.deadline_paused(), failed=self.infra_failed)

    def infra_failed(self) -> None:
        self.fault = FailureKind.INFRA

    def note_versions(self, versions: tuple[int, ...]) -> None:
        """Versions of a segment's tokens as the engine returns them (the rollouter stops rows by the oldest)."""
        if versions:
            oldest = min(versions)
            self.oldest_version = oldest if self.oldest_version is None else min(oldest, self.oldest_version)


def goes_on_from(prompt_ids: tuple[int, ...], call: ModelCall, known: Iterable[ModelCall]) -> bool:
    """Whether a prompt goes on from `call`'s answer: it continues the call's prompt, and what follows there is that
    answer, token for token (the client extended the turn it returned), or as the harness sent it back rewritten (cut
    at its stop word, stripped, re-serialised; the client then renders it afresh): it starts with more of this
    answer's tokens than with those of any other known answer to the same prompt (`known`: the calls recorded so
    far). A prompt equal to the call's asks it again; one that starts otherwise (an edited answer, a tie) shows
    nothing."""
    start = len(call.prompt_ids)
    if len(prompt_ids) <= start or prompt_ids[:start] != call.prompt_ids:
        return False
    following = prompt_ids[start:]
    shared = _shared_prefix(following, call.output_ids)
    if shared == len(call.output_ids):
        return True
    return shared > 0 and all(_shared_prefix(following, other.output_ids) < shared for other in known
                              if other is not call and len(other.prompt_ids) == start
                              and other.prompt_ids == call.prompt_ids)


def _shared_prefix(ids: Sequence[int], other: Sequence[int]) -> int:
    """How many leading ids the two share."""
    for index, (a, b) in enumerate(zip(ids, other, strict=False)):
        if a != b:
            return index
    return min(len(ids), len(other))


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
        self._replaced: tuple[list[TurnState], tuple[str, tuple[int, ...]] | None] = ([], None)

    def commit(self) -> None:
        """The responses were delivered: the calls join the episode (once)."""
        if self.committed:
            return
        self.committed = True
        self._replaced = (self.episode.turns, self.episode.last_completion)
        self.episode.calls += self.calls
        if self.turns is not None:
            self.episode.turns = self.turns
        if self.last_completion is not None:
            self.episode.last_completion = self.last_completion

    def doubt(self, doubtful: bool) -> None:
        """Whether the responses' connection closed before another request on it (`Episode.doubtful`)."""
        for call in self.calls:
            if doubtful and id(call) not in self.episode.went_on_from:
                self.episode.doubtful[id(call)] = call
            else:
                self.episode.doubtful.pop(id(call), None)

    def retract(self) -> None:
        """The responses were not received after all: the calls leave the episode, and the turns they set give way
        to those before (unless a later commit replaced them)."""
        if not self.committed:
            return
        self.committed = False
        self.doubt(False)
        mine = {id(call) for call in self.calls}
        self.episode.calls[:] = [call for call in self.episode.calls if id(call) not in mine]
        turns, last_completion = self._replaced
        if self.turns is not None and self.episode.turns is self.turns:
            self.episode.turns = turns
        if self.last_completion is not None and self.episode.last_completion is self.last_completion:
            self.episode.last_completion = last_completion
