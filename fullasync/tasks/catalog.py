"""The tasks `data.task` names: each gives a run its rows and its rollout function.

Owns: reading `data.task` (`arithmetic`, `reasoning_gym:<spec>`; "" = none) into a `BuiltTask`, and the refusal of
a name no task has. Does not own: the tasks themselves (`arithmetic`, `reasoning_gym`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fullasync.config import RunConfig

FAMILIES = ("arithmetic", "reasoning_gym:<generator>[*weight][+...] or reasoning_gym:<composite.yaml>")


@dataclass(frozen=True)
class BuiltTask:
    rollout_fn: Callable[..., Awaitable[float]]  # async def rollout_fn(client, row) -> reward
    train_rows: Sequence[object]
    val_rows: Sequence[object]


def built_task(config: RunConfig) -> BuiltTask | None:
    """The task `config.data.task` names, its rows generated; None for ""."""
    name = config.data.task.strip()
    if not name:
        return None
    if name == "arithmetic":
        from fullasync.tasks import arithmetic

        task = arithmetic.ArithmeticTask()
        return BuiltTask(arithmetic.rollout_for(config.model.served_name), task.rows("train"), task.rows("val"))
    if name.startswith("reasoning_gym:"):
        from fullasync.tasks import reasoning_gym

        generated = reasoning_gym.ReasoningGymTask(reasoning_gym.parse_spec(name.removeprefix("reasoning_gym:")),
                                                   config.data.task_rows, config.data.task_val_rows,
                                                   model=config.model.served_name, prompt=config.data.task_prompt)
        return BuiltTask(generated.rollout_fn, generated.rows("train"), generated.rows("val"))
    raise ValueError(f"data.task={name!r} is not a task; use {' | '.join(FAMILIES)}, or '' with data.rollout_fn "
                     "and data.train_dataset")
