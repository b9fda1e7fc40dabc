"""Admission control: how many more rows the rollouter may start without exceeding the staleness bound.

Owns: the formula, computed by one small pure method under a lock, with the trainer version
injected as a callable.

With `B` = groups per train step, `k` = max_staleness and `v` = the trainer's current version,
the rows started so far (accepted + running + finished-but-dropped are all "started") obey

    started ≤ (k + v + 1) · B

so a group started now is consumed by a train step at most k versions later: it is part of
batch number ⌈started / B⌉ ≤ k + v + 1, trained at version ≤ k + v, while its first token was
sampled at version ≥ v. Rows that end without a group (failed, filtered, dropped) free their
slot, since they will not occupy a batch. Independently, at most `max_running` rows run at once,
where a row counts by the share of its episodes still generating (a row of n episodes with one
long straggler left counts 1/n): the engines' slots, not the rows, are what concurrency protects,
and a straggler must not keep n − 1 slots empty. (`count_running="rows"` counts a row whole until its
last episode ends — the earlier policy, kept for comparison in `bench/scheduling.py`.)

For k = 0 this is synchronous on-policy training: batch v + 1 starts only after version v + 1.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

RUNNING_COUNTS = ("episodes", "rows")


def admission_capacity(max_staleness: int, version: int, batch_size: int, started: int, running: int | Fraction,
                       max_running: int) -> int:
    """Rows that may start now (the formula of the module docstring; never negative)."""
    by_staleness = (max_staleness + version + 1) * batch_size - started
    by_concurrency = math.floor(max_running - running)
    return max(0, min(by_staleness, by_concurrency))


@dataclass
class StalenessCounts:
    started: int = 0  # rows admitted and not released (running, queued or trained)
    running: Fraction = Fraction(0)  # rows still generating, each by the share of its episodes not yet done


class StalenessManager:
    """Thread-safe counters plus the formula; the version source is injected."""

    def __init__(self, max_staleness: int, batch_size: int, max_running: int, version: Callable[[], int],
                 count_running: str = "episodes") -> None:
        if max_staleness < 0 or batch_size < 1 or max_running < 1:
            raise ValueError("max_staleness >= 0, batch_size >= 1 and max_running >= 1 are required")
        if count_running not in RUNNING_COUNTS:
            raise ValueError(f"count_running={count_running!r}; choose one of {RUNNING_COUNTS}")
        self.by_episodes = count_running == "episodes"
        self.max_staleness = max_staleness
        self.batch_size = batch_size
        self.max_running = max_running
        self._version = version
        self._lock = threading.Lock()
        self.counts = StalenessCounts()

    def version(self) -> int:
        """The trainer's current version (what admission and the queue's staleness bound are measured from)."""
        return self._version()

    def capacity(self) -> int:
        with self._lock:
            return self._capacity()

    def try_start(self) -> bool:
        """Admit one row if the bound allows it."""
        with self._lock:
            if self._capacity() < 1:
                return False
            self._admit()
            return True

    def _capacity(self) -> int:
        """Rows that may start now (the caller holds the lock). Other frameworks' admission rules, for
        comparison in the simulator, override this and `_admit` (`fullasync.sim.peers`)."""
        return admission_capacity(self.max_staleness, self._version(), self.batch_size,
                                  self.counts.started, self.counts.running, self.max_running)

    def _admit(self) -> None:
        """Count one admitted row (the caller holds the lock)."""
        self.counts.started += 1
        self.counts.running += 1

    def episode_done(self, share: Fraction) -> None:
        """One episode of a running row ended: the row now counts `share` less toward concurrency."""
        if self.by_episodes:
            with self._lock:
                self.counts.running -= share

    def finish(self, produced_group: bool, running_share: Fraction | int = 1) -> None:
        """A row's episodes ended (`running_share`: its part not yet released by `episode_done`);
        without a group its slot is released."""
        with self._lock:
            self.counts.running -= running_share if self.by_episodes else 1
            if not produced_group:
                self.counts.started -= 1

    def restore(self, started: int) -> None:
        """Continue a run whose `started` rows (trained or queued) hold admission slots; none is running."""
        with self._lock:
            self.counts = StalenessCounts(started=started)

    def release(self) -> None:
        """A queued group was dropped (too stale) and will never be trained."""
        with self._lock:
            self.counts.started -= 1
