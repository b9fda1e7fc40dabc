"""Held-out evaluation: `samples_per_row` episodes of the user's harness per validation row.

Owns: running those episodes (bounded concurrency, the training episode timeout), the score (mean
reward; an episode that raises or times out scores 0) and the record of how many failed and the first
error, so a harness that breaks only on held-out rows is visible. Does not own: pausing training
generation around it (`Run` does that), or the harness (`Rollouter.run_harness`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fullasync.client import RolloutClient, RolloutService
from fullasync.observe.logs import progress
from fullasync.observe.metrics import task_means
from fullasync.types import Trajectory, row_task

log = logging.getLogger("fullasync")

TASK_SCORE = "task/"  # a task's held-out score in `Evaluation.metrics` (`task/<name>`; `val/task/<name>` logged)
RunHarness = Callable[[RolloutClient, object], Awaitable[float | Trajectory]]  # one episode on a row


@dataclass(frozen=True)
class Evaluation:
    """A held-out evaluation as the run records it: the score (what `val_before` / `val_after` hold), its standard
    error (nan: unknown), the episodes that failed, and any other numbers worth keeping beside it (`metrics`: in
    validation.jsonl and to the loggers as `val/<name>`)."""

    score: float
    stderr: float = math.nan
    failed: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, float]:
        """As validation.jsonl writes it (no stderr when it is unknown)."""
        known = {} if math.isnan(self.stderr) else {"stderr": self.stderr}
        return {"score": self.score, **known, "failed": float(self.failed), **self.metrics}


Evaluator = Callable[[RolloutService], Awaitable[Evaluation]]
"""An evaluation of the user's own (`AsyncAgentTrainer(evaluate_fn=...)`): held-out episodes on the run's engines
through `service.client(key)`, nothing recorded for training; the run calls it with training generation paused."""


@dataclass(frozen=True)
class ValidationResult:
    score: float  # mean reward over all episodes, failed ones counting 0
    episodes: int
    failed: int  # episodes that raised or timed out
    first_error: str | None  # "row <index>: <error>" of the first failure, for the report
    row_rewards: tuple[tuple[float, ...], ...] = ()  # per row, its episodes' rewards (failed ones 0)
    row_tasks: tuple[str | None, ...] = ()  # per row, the task it names (`row_task`)

    @property
    def stderr(self) -> float:
        """Standard error of the score over rows (each row's mean is one observation; nan for one row)."""
        means = [sum(rewards) / len(rewards) for rewards in self.row_rewards if rewards]
        if len(means) < 2:
            return float("nan")
        return statistics.stdev(means) / math.sqrt(len(means))

    def evaluation(self) -> Evaluation:
        """With the score of each task the rows name, as `task/<name>` (`row_task`)."""
        tasks = task_means(zip(self.row_tasks, self.row_rewards, strict=False), TASK_SCORE)  # () when none name one
        return Evaluation(self.score, self.stderr, self.failed, {"episodes": float(self.episodes), **tasks})


async def evaluate(service: RolloutService, run_harness: RunHarness, rows: Sequence[object], samples_per_row: int,
                   episode_timeout_s: float, concurrency: int = 64) -> ValidationResult:
    """Mean reward of `samples_per_row` episodes per row (failures count 0 and are reported)."""
    limit = asyncio.Semaphore(concurrency)
    failures: list[str] = []
    total = len(rows) * samples_per_row
    finished = 0

    async def one(index: int, row: object, sample: int) -> float:
        nonlocal finished
        async with limit:
            client = service.client(f"val-{index}-{sample}")
            try:
                async with asyncio.timeout(episode_timeout_s):
                    result = await run_harness(client, row)
                return float(result.reward if isinstance(result, Trajectory) else result)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a failed held-out episode scores 0; it is counted and reported
                kind = "timed out" if isinstance(error, TimeoutError) else f"{type(error).__name__}: {error}"
                failures.append(f"row {index}: {kind}")
                return 0.0
            finally:
                client.close()
                finished += 1
                log.info("validation %d/%d episodes", finished, total,
                         extra=progress("validation", finished, total, transient=True))

    rewards = await asyncio.gather(
        *(one(i, row, s) for (i, row), s in itertools.product(enumerate(rows), range(samples_per_row)))
    )
    per_row = tuple(tuple(rewards[i * samples_per_row:(i + 1) * samples_per_row]) for i in range(len(rows)))
    result = ValidationResult(sum(rewards) / len(rewards), len(rewards), len(failures),
                              failures[0] if failures else None, per_row, tuple(row_task(row) for row in rows))
    if failures:
        log.warning("validation: %d of %d episodes failed (scored 0); first: %s", result.failed, result.episodes,
                    result.first_error)
    return result
