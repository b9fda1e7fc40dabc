"""On-policy distillation's teacher: every trained sequence of a finished group scored by a frozen model.

Owns: `TeacherScorer` — each trajectory's training sequences (one per lineage, `Trajectory.to_sequences`) sent whole
to the teacher's engines as one prompt-scoring request each (`SamplingOptions.score_prompt`: the log-prob of every
token given the ones before, one forward pass, nothing sampled), the answers put back on the calls they came from
(`ModelCall.teacher_logprobs`, aligned with each call's output), each sequence scored once: a trajectory that carries
a teacher's log-probs already is refused. Scoring runs as a row's group is complete, before it is queued, while other
rows generate: never on the policy's engines. At most `max_concurrency` requests are at the teacher at once; a group
waiting for a place keeps its row's admission slot, so the teacher's lag holds generation back within the staleness
bound, never past it. An engine of the teacher that dies is waited for (its supervisor restarts it) and the request
sent again: a failure is the infrastructure's and is scored again, never a wrong signal; a teacher whose engines
cannot be restarted raises `TeacherError`, which stops the run. Its counts for each step's metrics (`teacher/...`).
Does not own: serving the teacher (`fullasync.launch.beside`), the loss (`fullasync.trainer.batch.Distillation`),
the teacher KL of the trained tokens (`fullasync.observe.metrics`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fullasync.contracts.engine import Engine, GenerateRequest, SamplingOptions
from fullasync.errors import EngineDiedError, EngineResumeTimeoutError, InfraError
from fullasync.types import ModelCall, Trajectory, TrajectoryGroup

SCORING = SamplingOptions(score_prompt=True, temperature=1.0)  # one token generated, thrown away


class TeacherError(InfraError):
    """The teacher could not score a sequence after its engines were restarted and its retries spent."""


@dataclass
class TeacherStats:
    sequences: int = 0  # scored, each once
    tokens: int = 0  # in the scored sequences (the teacher's prefill)
    groups: int = 0
    retries: int = 0  # requests sent again after an engine of the teacher died under them
    busy_s: float = 0.0  # wall time with at least one request at the teacher
    lag_s: float = 0.0  # summed over groups: from the group's last episode to its scores
    waiting: int = 0  # groups being scored now


class TeacherScorer:
    """`await scorer.score_group(group)`: the group with every trained call's teacher log-probs."""

    def __init__(self, name: str, engines: Sequence[Engine], *, check: Callable[[], None] = lambda: None,
                 max_concurrency: int = 8, retries: int = 3, backoff_s: float = 0.5,
                 restart_wait_s: float = 600.0) -> None:
        """`check()`: raises once the teacher's engines cannot be restarted (its supervisor gave up)."""
        if not engines:
            raise ValueError(f"teacher {name!r} has no engines")
        self.name = name
        self.engines = list(engines)
        self.check = check
        self.retries = retries
        self.backoff_s = backoff_s
        self.restart_wait_s = restart_wait_s
        self.stats = TeacherStats()
        self._places = asyncio.Semaphore(max_concurrency)
        self._load = {id(engine): 0 for engine in self.engines}
        self._ids = itertools.count()
        self._busy = 0
        self._busy_since = 0.0

    async def score_group(self, group: TrajectoryGroup) -> TrajectoryGroup:
        started = time.monotonic()
        self.stats.waiting += 1
        try:
            trajectories = await asyncio.gather(*(self.score_trajectory(t) for t in group.trajectories))
        finally:
            self.stats.waiting -= 1
        self.stats.groups += 1
        self.stats.lag_s += time.monotonic() - started
        return dataclasses.replace(group, trajectories=tuple(trajectories))

    async def score_trajectory(self, trajectory: Trajectory) -> Trajectory:
        """`trajectory` with each call's `teacher_logprobs`: its lineages' sequences scored at once."""
        if any(call.teacher_logprobs for call in trajectory.calls):
            raise ValueError("this trajectory carries a teacher's log-probs already: each sequence is scored once")
        lineages = [(lineage, sequence) for lineage, sequence in zip(trajectory.lineages(), trajectory.to_sequences(),
                                                                     strict=True)
                    if sequence.num_trained_tokens]
        scores = await asyncio.gather(*(self.score(sequence.token_ids) for _, sequence in lineages))
        calls = list(trajectory.calls)
        for (lineage, _), scored in zip(lineages, scores, strict=True):
            aligned = (0.0, *scored)  # the first token has no context to be scored in
            for index in lineage:
                calls[index] = _scored(calls[index], aligned)
        self.stats.sequences += len(lineages)
        return dataclasses.replace(trajectory, calls=tuple(calls))

    async def score(self, token_ids: Sequence[int]) -> tuple[float, ...]:
        """The teacher's log-prob of each token of `token_ids` after the first, given the ones before it."""
        async with self._places:
            for attempt in range(self.retries + 1):
                engine = await self._serving_engine()
                request = GenerateRequest(f"{self.name}-score-{next(self._ids)}", tuple(token_ids), 1, SCORING)
                self._start(engine)
                try:
                    result = await engine.generate(request)
                except (EngineDiedError, EngineResumeTimeoutError, TimeoutError) as error:
                    if attempt == self.retries:
                        raise TeacherError(f"teacher {self.name!r} did not score a sequence of {len(token_ids)} "
                                           f"tokens after {attempt + 1} tries: {error!r}") from error
                    self.stats.retries += 1
                    await asyncio.sleep(self.backoff_s * 2 ** attempt)
                    continue
                finally:
                    self._end(engine)
                scored = result.prompt_logprobs
                if len(scored) != len(token_ids) - 1 or not all(math.isfinite(lp) and lp <= 0 for lp in scored):
                    raise TeacherError(f"teacher {self.name!r} answered {len(scored)} log-probs for "
                                       f"{len(token_ids) - 1} tokens, or some not finite")
                self.stats.tokens += len(token_ids)
                return scored
        raise AssertionError("unreachable: the last try returns or raises")

    async def _serving_engine(self) -> Engine:
        """The teacher's engine with the fewest requests of ours that is not dead; while all are, the first to
        come back (within `restart_wait_s`)."""
        self._check()
        serving = [engine for engine in self.engines if engine.death is None]
        if serving:
            return min(serving, key=lambda engine: self._load[id(engine)])
        waits = {asyncio.ensure_future(engine.wait_serving()): engine for engine in self.engines}
        done, pending = await asyncio.wait(waits, timeout=self.restart_wait_s, return_when=asyncio.FIRST_COMPLETED)
        for wait in pending:
            wait.cancel()
        self._check()
        if not done:
            raise TeacherError(f"teacher {self.name!r}: no engine of it came back within {self.restart_wait_s:.0f} s")
        return waits[done.pop()]

    def _check(self) -> None:
        try:
            self.check()
        except Exception as failure:
            raise TeacherError(f"teacher {self.name!r}: its engines could not be restarted ({failure})") from failure

    def _start(self, engine: Engine) -> None:
        self._load[id(engine)] += 1
        if not self._busy:
            self._busy_since = time.monotonic()
        self._busy += 1

    def _end(self, engine: Engine) -> None:
        self._load[id(engine)] -= 1
        self._busy -= 1
        if not self._busy:
            self.stats.busy_s += time.monotonic() - self._busy_since

    def metrics(self) -> dict[str, float]:
        """The run so far: sequences and tokens scored, tokens/s while scoring, mean lag per group, retries."""
        stats = self.stats
        busy = stats.busy_s + (time.monotonic() - self._busy_since if self._busy else 0.0)
        return {"teacher/sequences": float(stats.sequences), "teacher/tokens": float(stats.tokens),
                "teacher/tokens_per_s": stats.tokens / busy if busy > 0 else 0.0,
                "teacher/lag_s": stats.lag_s / max(stats.groups, 1), "teacher/retries": float(stats.retries),
                "teacher/groups_waiting": float(stats.waiting)}


def _scored(call: ModelCall, aligned: Sequence[float]) -> ModelCall:
    """`call` with the teacher's log-probs of its output: the positions after its prompt in its lineage's sequence
    (`aligned`: one per token of the sequence)."""
    start = len(call.prompt_ids)
    return dataclasses.replace(call, teacher_logprobs=tuple(aligned[start : start + len(call.output_ids)]))
