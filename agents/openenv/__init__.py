"""OpenEnv environments as a run's task: `data.task=openenv:<package>` (or `openenv:ws://host:port` for a server
you run), or a harness of its own (`OpenEnvGenerator(OpenEnvSpec(...))` with `openenv_rows`).

- `server.py`: runs in openenv's own interpreter (stdlib + uvicorn + openenv): serves the environment unchanged
  with openenv's `create_app`, as many sessions as the run has episodes at once, on loopback.
- `process.py`: that interpreter and the server process; `session.py`: an episode's WebSocket session and the
  default text agent; `generator.py`: `OpenEnvGenerator`, the agent loop through the episode's client.

The rows are the environment's resets: row i resets with seed i (held-out rows with seeds of their own, never a
training seed) and `data.task_args.reset`'s options. Does not own: the gateway, recording, the rollouter.
"""

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from fullasync.types import JsonValue
from fullasync_agents.openenv.generator import OpenEnvGenerator, OpenEnvSpec
from fullasync_agents.openenv.process import OpenEnvMissingError, OpenEnvServerError, openenv_python
from fullasync_agents.openenv.session import OpenEnvEpisodeError

__all__ = ["OpenEnvEpisodeError", "OpenEnvGenerator", "OpenEnvMissingError", "OpenEnvServerError", "OpenEnvSpec",
           "openenv_python", "openenv_rows", "openenv_task"]

VAL_SEED = 1_000_003  # the held-out rows' first seed: far past any training row's

Row = dict[str, Any]  # {"id", "task", "openenv": the reset's options}


def openenv_rows(name: str, count: int, held_out: int, reset: Mapping[str, JsonValue] | None = None,
                 ) -> tuple[list[Row], list[Row]]:
    """`count` training rows (seeds 0..count-1) and `held_out` held-out rows (seeds from VAL_SEED)."""
    if count >= VAL_SEED:
        raise ValueError(f"{count} OpenEnv training rows would reach the held-out seeds (from {VAL_SEED})")

    def row(split: str, index: int, seed: int) -> Row:
        return {"id": f"{name}/{split}/{index}", "task": name, "openenv": {**dict(reset or {}), "seed": seed}}

    return ([row("train", i, i) for i in range(count)], [row("val", i, VAL_SEED + i) for i in range(held_out)])


def openenv_task(target: str, task_args: Mapping[str, JsonValue], model: str, rows: int, held_out: int,
                 sessions: int) -> tuple[OpenEnvGenerator, list[Row], list[Row]]:
    """`data.task=openenv:<target>`: the environment's generator, training rows and held-out rows. `target` is a
    package (the run serves it) or a server's URL; `task_args` holds OpenEnvSpec's other fields and `reset` (the
    options every reset gets); `sessions` is the run's episodes at once (task_args.sessions replaces it)."""
    args = dict(task_args)
    reset = args.pop("reset", None) or {}
    if not isinstance(reset, Mapping):
        raise ValueError(f"data.task_args.reset is the options of each reset (a mapping), got {reset!r}")
    known = {f.name for f in fields(OpenEnvSpec)} - {"module", "url", "model"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"data.task=openenv:{target}: data.task_args {unknown} are not OpenEnv settings; use "
                         f"{sorted(known | {'reset'})}")
    where = {"url": target} if "://" in target else {"module": target}
    spec = OpenEnvSpec(**where, model=model, **{"sessions": sessions, **args})  # type: ignore[arg-type]
    train, val = openenv_rows(target.split("://")[-1], rows, held_out, reset)
    return OpenEnvGenerator(spec), train, val
