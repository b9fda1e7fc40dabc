"""The records every component exchanges: model calls, trajectories, groups, training sequences.

Owns: the data contracts and their invariants (checked at construction).
Does not own: how records are produced (client, rollouter) or consumed (trainer).
Imports no torch, vLLM or Ray, so the contracts load anywhere.

Alignment rule, stated once: in a `ModelCall`, `output_ids`, `output_logprobs` and
`output_versions` are aligned index by index (one entry per generated token). In a
`TrainingSequence`, `token_ids`, `loss_mask`, `logprobs` and `versions` are aligned likewise. `teacher_logprobs`
(on-policy distillation: a frozen teacher's log-prob of each sampled token in its context) is aligned the same way
in either record, or empty where no teacher scored it.
"""

from __future__ import annotations

import enum
import itertools
import math
import operator
import re
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

JsonValue: TypeAlias = "str | int | float | bool | None | Sequence[JsonValue] | Mapping[str, JsonValue]"
"""A value JSON can hold (what crosses a process boundary as JSON, or is passed on to a library as such)."""

PROMPT_VERSION = -1
"""Version recorded for tokens the model did not sample (prompt, template, environment)."""


def check_aligned(record: str, anchor: tuple[str, Sized], arrays: Mapping[str, Sized],
                  optional: Mapping[str, Sized] | None = None) -> None:
    """Raise ValueError naming every array of `record` whose length differs from `anchor`'s (one entry per
    token); `optional` arrays may also be empty (not recorded)."""
    name, n = anchor[0], len(anchor[1])
    wrong = {k: len(v) for k, v in arrays.items() if len(v) != n}
    wrong |= {k: len(v) for k, v in (optional or {}).items() if len(v) not in (0, n)}
    if wrong:
        counts = ", ".join(f"{length} {k}" for k, length in wrong.items())
        raise ValueError(f"{record} arrays must be aligned with {name} (one entry per token): {n} {name}, {counts}")


class FinishReason(str, enum.Enum):
    """Why a model call stopped. `abort` never reaches a recorded call: the client resumes it."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True)
class ModelCall:
    """One completed model call of an episode, after any resumptions were stitched together.

    `output_versions[i]`: the oldest weight version that computed anything token i was sampled from (the
    sampling weights, or the older weights of its KV cache after a PauseMode.KEEP push); staleness and
    proximal policies use it. `output_weight_versions[i]`: the sampling weights' version alone; empty when
    it equals `output_versions` everywhere (always, unless a KEEP push landed inside the call).
    """

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    finish_reason: FinishReason
    num_resumes: int = 0
    resubmitted_tokens: int = 0  # output tokens sent again as prompt when resuming after aborts
    engine: str = ""
    output_weight_versions: tuple[int, ...] = ()
    starved_resumes: int = 0  # of its resumes, those after an interruption that came before it produced a token
    teacher_logprobs: tuple[float, ...] = ()  # the teacher's log-prob of each output token (empty: not scored)

    def __post_init__(self) -> None:
        check_aligned("ModelCall", ("output_ids", self.output_ids),
                      {"output_logprobs": self.output_logprobs, "output_versions": self.output_versions},
                      {"output_weight_versions": self.output_weight_versions,
                       "teacher_logprobs": self.teacher_logprobs})
        if not self.prompt_ids:
            raise ValueError("ModelCall.prompt_ids is empty: a model call needs at least one prompt token")
        # The per-token checks run in C (sorted, min, max, sum): a Python loop per token here was a fifth of
        # the driver's CPU at scale (bench/control_plane.py).
        versions = tuple(self.output_versions)
        if versions and (versions[0] < 0 or versions != tuple(sorted(versions))):
            if min(versions) < 0:
                raise ValueError("ModelCall.output_versions must be >= 0 (the weight version that sampled each token)")
            raise ValueError(f"ModelCall.output_versions must be non-decreasing, got {self.output_versions}")
        for name in ("output_logprobs", "teacher_logprobs"):
            logprobs = getattr(self, name)
            if logprobs and (not max(logprobs) <= 0.0 or math.isnan(sum(logprobs))):  # a NaN makes the sum NaN
                raise ValueError(f"ModelCall.{name} must be finite-or--inf log-probabilities <= 0")
        if self.finish_reason is FinishReason.ABORT:
            raise ValueError("ModelCall cannot finish with 'abort': aborted calls are resumed before recording")
        if self.num_resumes < 0 or self.resubmitted_tokens < 0 or not 0 <= self.starved_resumes <= self.num_resumes:
            raise ValueError("ModelCall.num_resumes and resubmitted_tokens must be >= 0, starved_resumes between 0 "
                             "and num_resumes")
        if self.output_weight_versions and any(
                w < v for w, v in zip(self.output_weight_versions, self.output_versions, strict=True)):
            raise ValueError("ModelCall.output_weight_versions must never be older than output_versions (the oldest "
                             "version in a token's context)")

    @property
    def all_ids(self) -> tuple[int, ...]:
        """Prompt followed by output: the context a following call extends."""
        return self.prompt_ids + self.output_ids


@dataclass(frozen=True)
class TrainingSequence:
    """One token sequence for the trainer; `prompt_length` tokens of context come first."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    prompt_length: int
    teacher_logprobs: tuple[float, ...] = ()  # the teacher's log-prob of each sampled token, 0 elsewhere; () = none

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        check_aligned("TrainingSequence", ("token_ids", self.token_ids),
                      {"loss_mask": self.loss_mask, "logprobs": self.logprobs, "versions": self.versions},
                      {"teacher_logprobs": self.teacher_logprobs})
        if not 0 < self.prompt_length <= n:
            raise ValueError(f"TrainingSequence.prompt_length must be in [1, {n}], got {self.prompt_length}")
        if not set(self.loss_mask) <= {0, 1}:
            raise ValueError("TrainingSequence.loss_mask holds only 0 and 1")
        if any(self.loss_mask[: self.prompt_length]):
            raise ValueError("TrainingSequence: prompt tokens must have loss_mask 0")
        sampled = set(itertools.compress(self.versions, self.loss_mask))
        inserted = set(itertools.compress(self.versions, map(operator.not_, self.loss_mask)))
        if PROMPT_VERSION in sampled or not inserted <= {PROMPT_VERSION}:
            raise ValueError("TrainingSequence: sampled tokens carry a version >= 0, others PROMPT_VERSION")

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


def _freeze_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Trajectory:
    """The ordered model calls of one episode, its reward and metadata."""

    calls: tuple[ModelCall, ...]
    reward: float
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "calls", tuple(self.calls))
        object.__setattr__(self, "metadata", _freeze_mapping(self.metadata))
        if not self.calls:
            raise ValueError("Trajectory has no model calls: record at least one call through the client")
        if not math.isfinite(self.reward):
            raise ValueError(f"Trajectory.reward must be a finite float, got {self.reward!r}")

    @property
    def num_output_tokens(self) -> int:
        return sum(len(c.output_ids) for c in self.calls)

    def lineages(self) -> tuple[tuple[int, ...], ...]:
        """Indices into `calls` of each lineage's calls, lineages in the order of their first call.

        A lineage is an open context: the prompt + output of its last call. A call joins the lineage whose
        context its prompt extends exactly (starts with it token for token); where several do, the longest
        context (the closest match), and among equal ones the earliest lineage. A call that extends none
        starts a new lineage: a sub-agent, a compacted or rewritten context, or a fork (a second call
        extending a context that an earlier call already extended, so that the context grew past it).
        """
        members: list[list[int]] = []
        contexts: list[tuple[int, ...]] = []
        for index, call in enumerate(self.calls):
            joined = _longest_extended(contexts, call.prompt_ids)
            if joined is None:
                members.append([index])
                contexts.append(call.all_ids)
            else:
                members[joined].append(index)
                contexts[joined] = call.all_ids
        return tuple(tuple(m) for m in members)

    def to_sequences(self) -> list[TrainingSequence]:
        """Training sequences of this episode: one per lineage (`lineages`), in the order of their first call.

        A lineage's calls merge into one sequence: its first call's prompt is the context (loss-mask 0), each
        call's output is trained (loss-mask 1, with its log-probs and versions), and the tokens a later call's
        prompt inserts after the lineage's context (template, tool results) get loss-mask 0. Every sampled
        token of the episode is in exactly one sequence; interleaved calls of a parent and its sub-agent
        (A1, B1, A2, B2) make two sequences, not four.
        """
        sequences = []
        for lineage in self.lineages():
            builder = _SequenceBuilder(self.calls[lineage[0]].prompt_ids)
            for index in lineage:
                builder.add(self.calls[index])
            sequences.append(builder.build())
        return sequences


def _longest_extended(contexts: Sequence[tuple[int, ...]], prompt: tuple[int, ...]) -> int | None:
    """Index of the longest of `contexts` that `prompt` starts with (the earliest among equals), or None."""
    best: int | None = None
    for index, context in enumerate(contexts):
        n = len(context)
        if n > len(prompt) or (best is not None and n <= len(contexts[best])):
            continue
        if prompt[n - 1] == context[-1] and prompt[:n] == context:  # the last token first: a cheap mismatch
            best = index
    return best


class _SequenceBuilder:
    """Accumulates the calls of one lineage (each prompt extending the context so far) into a training sequence."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_length = len(prompt_ids)
        self.token_ids: list[int] = list(prompt_ids)
        self.loss_mask = [0] * len(prompt_ids)
        self.logprobs = [0.0] * len(prompt_ids)
        self.versions = [PROMPT_VERSION] * len(prompt_ids)
        self.calls: list[ModelCall] = []

    def add(self, call: ModelCall) -> None:
        inserted = call.prompt_ids[len(self.token_ids) :]
        self.token_ids += inserted
        self.loss_mask += [0] * len(inserted)
        self.logprobs += [0.0] * len(inserted)
        self.versions += [PROMPT_VERSION] * len(inserted)
        self.token_ids += call.output_ids
        self.loss_mask += [1] * len(call.output_ids)
        self.logprobs += call.output_logprobs
        self.versions += call.output_versions
        self.calls.append(call)

    def teacher_logprobs(self) -> tuple[float, ...]:
        """The teacher's log-probs on the sequence (0 on tokens not sampled); () unless every call was scored."""
        if not all(call.teacher_logprobs or not call.output_ids for call in self.calls) \
                or not any(call.teacher_logprobs for call in self.calls):
            return ()
        teacher = [0.0] * len(self.token_ids)
        for call in self.calls:  # a call's output follows its prompt, which is the sequence up to there
            teacher[len(call.prompt_ids) : len(call.prompt_ids) + len(call.output_ids)] = call.teacher_logprobs
        return tuple(teacher)

    def build(self) -> TrainingSequence:
        return TrainingSequence(
            token_ids=tuple(self.token_ids),
            loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs),
            versions=tuple(self.versions),
            prompt_length=self.prompt_length,
            teacher_logprobs=self.teacher_logprobs(),
        )


TASK_NAME = re.compile(r"[\w.:/-]{1,64}")  # a task's name: no spaces, at most 64 characters


def row_task(row: object) -> str | None:
    """The task a dataset row names in its `task` field, which splits a step's rewards and the held-out score by
    task (a mixture's generators, a dataset's task column); None: no such field, or one that is not a name (a
    task's instruction text, say)."""
    task = row.get("task") if isinstance(row, Mapping) else None
    return task if isinstance(task, str) and TASK_NAME.fullmatch(task) else None


@dataclass(frozen=True)
class TrajectoryGroup:
    """The trajectories sampled for one dataset row (the unit of group-relative advantages)."""

    row_id: str
    trajectories: tuple[Trajectory, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trajectories", tuple(self.trajectories))
        object.__setattr__(self, "metadata", _freeze_mapping(self.metadata))
        if not self.trajectories:
            raise ValueError(f"TrajectoryGroup {self.row_id!r} is empty: a group needs at least one trajectory")

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(t.reward for t in self.trajectories)

    @property
    def min_version(self) -> int:
        """The oldest weight version that sampled any token in the group (-1 if none sampled)."""
        versions = [v for t in self.trajectories for c in t.calls for v in c.output_versions]
        return min(versions) if versions else PROMPT_VERSION


# -- plain-data form (checkpoints): JSON-ready dicts, readable without torch --------------------------------

def _plain_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata as JSON-ready data; a value JSON cannot hold is kept as its `repr` under its key."""
    import json

    plain = {}
    for key, value in metadata.items():
        try:
            json.dumps(value, allow_nan=True)
            plain[str(key)] = value
        except (TypeError, ValueError):
            plain[str(key)] = repr(value)
    return plain


def call_to_dict(call: ModelCall) -> dict[str, Any]:
    return {
        "prompt_ids": list(call.prompt_ids), "output_ids": list(call.output_ids),
        "output_logprobs": list(call.output_logprobs), "output_versions": list(call.output_versions),
        "finish_reason": call.finish_reason.value, "num_resumes": call.num_resumes,
        "resubmitted_tokens": call.resubmitted_tokens, "engine": call.engine,
        "output_weight_versions": list(call.output_weight_versions), "starved_resumes": call.starved_resumes,
        **({"teacher_logprobs": list(call.teacher_logprobs)} if call.teacher_logprobs else {}),
    }


def call_from_dict(data: Mapping[str, Any]) -> ModelCall:
    return ModelCall(
        prompt_ids=tuple(data["prompt_ids"]), output_ids=tuple(data["output_ids"]),
        output_logprobs=tuple(float(lp) for lp in data["output_logprobs"]),
        output_versions=tuple(data["output_versions"]), finish_reason=FinishReason(data["finish_reason"]),
        num_resumes=data.get("num_resumes", 0), resubmitted_tokens=data.get("resubmitted_tokens", 0),
        engine=data.get("engine", ""), output_weight_versions=tuple(data.get("output_weight_versions", ())),
        starved_resumes=data.get("starved_resumes", 0),
        teacher_logprobs=tuple(float(lp) for lp in data.get("teacher_logprobs", ())),
    )


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    return {"calls": [call_to_dict(c) for c in trajectory.calls], "reward": trajectory.reward,
            "metadata": _plain_metadata(trajectory.metadata)}


def trajectory_from_dict(data: Mapping[str, Any]) -> Trajectory:
    return Trajectory(calls=tuple(call_from_dict(c) for c in data["calls"]), reward=float(data["reward"]),
                      metadata=data.get("metadata", {}))


def group_to_dict(group: TrajectoryGroup) -> dict[str, Any]:
    """`group` as JSON-ready data (log-probs of -inf are written as JSON's non-standard `-Infinity`)."""
    return {"row_id": group.row_id, "trajectories": [trajectory_to_dict(t) for t in group.trajectories],
            "metadata": _plain_metadata(group.metadata)}


def group_from_dict(data: Mapping[str, Any]) -> TrajectoryGroup:
    """The inverse of `group_to_dict`; every invariant is checked again on the way in."""
    return TrajectoryGroup(row_id=data["row_id"],
                           trajectories=tuple(trajectory_from_dict(t) for t in data["trajectories"]),
                           metadata=data.get("metadata", {}))
