"""Pushes new weights into running engines: pause → push → bump version → resume.

Owns: the order of those steps, their timeouts, and their timing. Resume happens in `finally`, so
an engine is never left paused by a failed push. Does not own: how the trainer exports weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from fullasync.engines.protocol import Engine, PauseMode


@dataclass(frozen=True)
class WeightPushTiming:
    """Seconds spent in each phase of one push, and the version it installed."""

    version: int
    pause_s: float
    update_s: float
    resume_s: float

    @property
    def total_s(self) -> float:
        return self.pause_s + self.update_s + self.resume_s


class WeightSync:
    """Installs successive weight versions on a fixed set of engines."""

    def __init__(self, engines: Sequence[Engine], mode: PauseMode = PauseMode.ABORT, version: int = 0) -> None:
        if not engines:
            raise ValueError("WeightSync needs at least one engine")
        self.engines = list(engines)
        self.mode = PauseMode(mode)
        self.version = version

    def check_engines(self) -> None:
        """Raise the death of the first engine declared dead (the run cannot push to it)."""
        for engine in self.engines:
            if engine.death is not None:
                raise engine.death

    async def push(self, named_tensors: object) -> WeightPushTiming:
        """Install `named_tensors` (a name→tensor mapping, or a Ray ref to one) as version + 1."""
        self.check_engines()
        new_version = self.version + 1
        clock = asyncio.get_running_loop().time  # the loop's clock: real, or simulated (fullasync.sim)
        start = clock()
        try:
            await asyncio.gather(*(e.pause(self.mode) for e in self.engines))
            paused = clock()
            await asyncio.gather(*(e.update_weights(named_tensors, new_version) for e in self.engines))
            self.version = new_version
            updated = clock()
        finally:
            resume_start = clock()
            await asyncio.gather(*(e.resume() for e in self.engines))
        end = clock()
        return WeightPushTiming(new_version, paused - start, updated - paused, end - resume_start)
