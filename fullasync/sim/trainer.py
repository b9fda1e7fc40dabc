"""`SimulatedTrainer`: the `Trainer` contract of a run, with time proportional to trained tokens.

Owns: the timing of a train step on `num_devices` data-parallel devices and a record of where the
trainer's time went. Does not own: any model, loss or weights — `export_weights` returns a token
object; the push time is modelled by the engines (`DecodeCost.push_s`).

    train_step time = step_overhead_s + per_token_device_s · trained tokens / num_devices

where trained tokens are the tokens of every training sequence (forward and backward see the
whole sequence): prompt + output of a call, and for a multi-turn episode the final context of each of
its lineages once (calls that extend each other's context, `Trajectory.lineages`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fullasync.contracts.weights import NamedTensors
from fullasync.types import Trajectory, TrajectoryGroup


def sequence_tokens(trajectory: Trajectory) -> int:
    """Tokens of `trajectory.to_sequences()`, counted without building them: a lineage's sequence is its last
    call's prompt + output."""
    return sum(len(trajectory.calls[lineage[-1]].all_ids) for lineage in trajectory.lineages())


@dataclass(frozen=True)
class TrainCost:
    per_token_device_s: float = 1e-4  # device-seconds to train on one token (forward + backward + optimizer share)
    step_overhead_s: float = 0.5  # fixed per step (optimizer step, gradient all-reduce, bookkeeping)

    def step_s(self, tokens: int, num_devices: int) -> float:
        return self.step_overhead_s + self.per_token_device_s * tokens / num_devices


@dataclass(frozen=True)
class SimulatedBatch:
    groups: tuple[TrajectoryGroup, ...]
    samples: int
    tokens: int  # prompt + output tokens over all calls


@dataclass
class TrainerTime:
    train_s: float = 0.0
    steps: int = 0
    tokens: int = 0


class SimulatedTrainer:
    """Implements `fullasync.contracts.run.Trainer` with a cost model instead of a model."""

    def __init__(self, cost: TrainCost, num_devices: int) -> None:
        if num_devices < 1:
            raise ValueError(f"SimulatedTrainer needs at least one device, got {num_devices}")
        self.cost = cost
        self.config = cost  # its only settings
        self.num_devices = num_devices
        self.step = 0
        self.time = TrainerTime()
        self.trained_rows: list[str] = []  # the rows of every step, in order (its "model" is what it trained on)

    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def restart(self) -> None:
        """Its "model" is lost with its process: back to the start (a checkpoint's state is loaded next)."""
        self.step, self.trained_rows = 0, []

    def build_batch(self, groups: Sequence[TrajectoryGroup]) -> SimulatedBatch:
        return SimulatedBatch(
            groups=tuple(groups),
            samples=sum(len(g.trajectories) for g in groups),
            tokens=sum(sequence_tokens(t) for g in groups for t in g.trajectories),
        )

    @property
    def binds_late(self) -> bool:
        return True

    async def train_step(self, batch: SimulatedBatch, trainer_version: int | None = None,
                         late: Callable[[], Awaitable[SimulatedBatch]] | None = None) -> dict[str, float]:
        """`batch`'s share of the step's time, then (with `late`) the rest's; the fixed overhead once, at the end
        (the optimizer step)."""
        parts = [batch]
        await asyncio.sleep(self.cost.per_token_device_s * batch.tokens / self.num_devices)
        if late is not None:
            parts.append(await late())
            await asyncio.sleep(self.cost.per_token_device_s * parts[-1].tokens / self.num_devices)
        await asyncio.sleep(self.cost.step_overhead_s)
        tokens = sum(part.tokens for part in parts)
        seconds = self.cost.step_s(tokens, self.num_devices)
        self.step += 1
        self.trained_rows += [group.row_id for part in parts for group in part.groups]
        self.time.train_s += seconds
        self.time.steps += 1
        self.time.tokens += tokens
        return {"train/tokens": float(tokens), "train/step_s": seconds}

    async def export_weights(self) -> NamedTensors:
        return {}  # simulated engines hold no weights: a push only moves the version

    async def save_checkpoint(self, path: str | None = None) -> str:
        if path:
            Path(path).mkdir(parents=True, exist_ok=True)  # a real trainer's folder (its contents are not simulated)
        return path or ""

    async def save_state(self, path: str) -> None:
        """Its state: the step and the rows trained so far (a resumed run must never train one twice)."""
        Path(path).mkdir(parents=True)
        (Path(path) / "trainer.json").write_text(json.dumps({"step": self.step, "trained_rows": self.trained_rows}))

    async def load_state(self, path: str) -> None:
        state = json.loads((Path(path) / "trainer.json").read_text())
        self.step, self.trained_rows = state["step"], list(state["trained_rows"])
