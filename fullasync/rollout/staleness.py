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

**The bound is a ceiling, not the operating point** (`generate_ahead="adaptive"`, a run's default).
Filling all k + 1 batches ahead only pays while generation is the bottleneck; when training is, the
queue fills, every trained token sits at the bound and nothing runs faster for it. So admission
also keeps `started ≤ v·B + lead`, where the lead (rows admitted and not yet consumed by a finished
step, the batch in training included) moves between 2·B — the batch in training plus the next one
generating beside it, staleness ≈ 1 — and (k + 1)·B, the bound itself. At each batch request the
trainer reports how many groups were ready (`on_batch_request`), against a target of B + B/4 (a
quarter batch of margin for the long tail):
- fewer, and admission had been held back by the lead since the last request: the pipeline ran
  short because of the lead, so it grows by the shortfall;
- more: those groups were generated earlier than the trainer needed them (they will be a version
  older when trained), so it shrinks by a quarter of the surplus — slowly, because a change of the
  lead shows in the groups ready only after a row's generation time, which in agentic work spans
  several steps (shrinking by half the surplus overshot there and cost 5 % of samples/s).
When generation is the bottleneck the trainer always finds fewer than B and the lead climbs to the
bound (the earlier behaviour); when training is, it settles where about one batch is ready at each
request. It starts at the floor, two batches, and grows only while the trainer finds too little
ready: a run never trains data staler than it needs, also in its first steps. (Chosen in the
simulator, `bench/pacing.py`: without the quarter-batch margin the trainer waited for the tail at the
floor and lost 4–5 % of samples/s where training was the bottleneck. Starting at the bound instead
reached full speed sooner — over the first 12 steps up to 14 % more samples/s where generation and
training were near balance, nothing after step 6 — but trained its first steps at the bound, and a
default deepresearch run that started so collapsed to one-turn answers: the freshness is worth it.)
`generate_ahead="bound"` keeps the lead at (k + 1)·B (the earlier policy, for comparison).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from fullasync.config.run import GENERATE_AHEAD

RUNNING_COUNTS = ("episodes", "rows")
MARGIN_DIVISOR = 4  # the adaptive lead aims at B + B/4 groups ready at each batch request (module docstring)


def admission_capacity(max_staleness: int, version: int, batch_size: int, started: int, running: int | Fraction,
                       max_running: int, lead: int | None = None) -> int:
    """Rows that may start now (the formulas of the module docstring; never negative). `lead`: rows
    allowed beyond those consumed by finished steps (None: the bound's own, (k + 1)·B)."""
    ceiling = (max_staleness + 1) * batch_size
    by_staleness = version * batch_size + (ceiling if lead is None else min(lead, ceiling)) - started
    by_concurrency = math.floor(max_running - running)
    return max(0, min(by_staleness, by_concurrency))


@dataclass
class Lead:
    """How far admission runs ahead of training, adapted at each batch request (module docstring)."""

    floor: int  # 2·B: the batch in training and the next one beside it (B when k = 0)
    ceiling: int  # (k + 1)·B: the staleness bound
    rows: int  # the lead now
    held_back: bool = False  # admission was refused by the lead (only) since the last batch request

    @classmethod
    def for_bound(cls, max_staleness: int, batch_size: int) -> Lead:
        ceiling = (max_staleness + 1) * batch_size
        floor = min(2 * batch_size, ceiling)
        return cls(floor=floor, ceiling=ceiling, rows=floor)

    def on_batch_request(self, ready: int, batch_size: int) -> None:
        target = batch_size + batch_size // MARGIN_DIVISOR
        if ready < target and self.held_back:
            self.rows = min(self.ceiling, self.rows + target - ready)
        elif ready > target:
            self.rows = max(self.floor, self.rows - math.ceil((ready - target) / 4))
        self.held_back = False


@dataclass
class StalenessCounts:
    started: int = 0  # rows admitted and not released (running, queued or trained)
    running: Fraction = Fraction(0)  # rows still generating, each by the share of its episodes not yet done


class StalenessManager:
    """Thread-safe counters plus the formula; the version source is injected."""

    def __init__(self, max_staleness: int, batch_size: int, max_running: int, version: Callable[[], int],
                 count_running: str = "episodes", generate_ahead: str = "bound") -> None:
        if max_staleness < 0 or batch_size < 1 or max_running < 1:
            raise ValueError("max_staleness >= 0, batch_size >= 1 and max_running >= 1 are required")
        if count_running not in RUNNING_COUNTS:
            raise ValueError(f"count_running={count_running!r}; choose one of {RUNNING_COUNTS}")
        if generate_ahead not in GENERATE_AHEAD:
            raise ValueError(f"generate_ahead={generate_ahead!r}; choose one of {GENERATE_AHEAD}")
        self.by_episodes = count_running == "episodes"
        self.max_staleness = max_staleness
        self.batch_size = batch_size
        self.max_running = max_running
        self._version = version
        self._lock = threading.Lock()
        self.counts = StalenessCounts()
        self.lead = Lead.for_bound(max_staleness, batch_size) if generate_ahead == "adaptive" else None

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

    @property
    def lead_rows(self) -> int:
        """Rows admission may run ahead of the steps finished so far (the bound's (k + 1)·B when not adaptive)."""
        return self.lead.rows if self.lead is not None else (self.max_staleness + 1) * self.batch_size

    def on_batch_request(self, ready: int) -> None:
        """The trainer asked for a batch and found `ready` groups waiting: adapt the lead (module docstring)."""
        if self.lead is not None:
            with self._lock:
                self.lead.on_batch_request(ready, self.batch_size)

    def _capacity(self) -> int:
        """Rows that may start now (the caller holds the lock). Other frameworks' admission rules, for
        comparison in the simulator, override this and `_admit` (`fullasync.sim.peers`)."""
        args = (self.max_staleness, self._version(), self.batch_size, self.counts.started, self.counts.running,
                self.max_running)
        if self.lead is None:
            return admission_capacity(*args)
        capacity = admission_capacity(*args, lead=self.lead.rows)
        if capacity < 1 and admission_capacity(*args) >= 1:
            self.lead.held_back = True
        return capacity

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
