"""The tasks `data.task` names: each gives a run its rows and its rollout function.

Owns: reading `data.task` (`arithmetic`, `reasoning_gym:<spec>`, `verifiers:<env id>`, `openenv:<package or URL>`;
"" = none) into a
`BuiltTask`, and the refusal of a name no task has. Does not own: the tasks themselves (`arithmetic`,
`reasoning_gym`; verifiers environments run out of process through the gateway: `fullasync_agents.verifiers`;
OpenEnv servers in openenv's interpreter: `fullasync_agents.openenv`; harness packages imported only when named).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

from fullasync.config import RunConfig

FAMILIES = ("arithmetic", "reasoning_gym:<generator>[*weight][+...] or reasoning_gym:<composite.yaml>",
            "verifiers:<environment id>", "openenv:<environment package> or openenv:ws://host:port")


@dataclass(frozen=True)
class BuiltTask:
    # async def rollout_fn(client, row) -> reward, or a CustomGenerator (a harness out of process: verifiers')
    rollout_fn: Callable[..., Awaitable[float]] | object
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
    if name.startswith("verifiers:"):
        generator, train, held_out = _adapter(name, "verifiers").verifiers_task(
            name.removeprefix("verifiers:").strip(), config.data.task_args, config.model.served_name)
        return BuiltTask(generator, train, held_out)
    if name.startswith("openenv:"):
        rollout = config.rollout
        # every episode of the running rows, and as many again for held-out evaluations beside them
        sessions = max(16, 2 * rollout.max_running_rows * rollout.n)
        generator, train, held_out = _adapter(name, "openenv").openenv_task(
            name.removeprefix("openenv:").strip(), config.data.task_args, config.model.served_name,
            config.data.task_rows, config.data.task_val_rows, sessions)
        return BuiltTask(generator, train, held_out)
    raise ValueError(f"data.task={name!r} is not a task; use {' | '.join(FAMILIES)}, or '' with data.rollout_fn "
                     "and data.train_dataset")


def _adapter(name: str, family: str) -> ModuleType:
    try:
        return importlib.import_module(f"fullasync_agents.{family}")
    except ImportError as error:
        raise ValueError(f"data.task={name!r} needs fullasync_agents (pip install -e '.[agents]' in the checkout): "
                         f"{error}") from error
