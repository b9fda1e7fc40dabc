"""verifiers environments (Prime Intellect's Environments Hub) as a run's task: `data.task=verifiers:<env id>`
(`verifiers_task`), or a harness of its own (`VerifiersGenerator(VerifiersSpec(...))` with `verifiers_rows`).

- `worker.py`: runs in verifiers' own interpreter (stdlib + verifiers): loads the environment unchanged
  (`vf.load_environment(id, **data.task_args)`), lists its rows, and serves its episodes and groups.
- `generator.py`: `VerifiersGenerator`, the run's side: one worker per run, one model client for every episode on
  the gateway's run-wide base URL, rewards from the environment's own rubric (a group rubric: through
  `group_rewards`), its errors as failures of their kind.
- `rows.py`: the environment's datasets as the run's rows; `interpreter.py`: where verifiers runs.

Does not own: the gateway, recording, the rollouter.
"""

import logging
from collections.abc import Mapping

from fullasync.types import JsonValue
from fullasync_agents.verifiers.generator import (
    KEY,
    VerifiersEpisodeError,
    VerifiersGenerator,
    VerifiersSpec,
    VerifiersWorkerError,
)
from fullasync_agents.verifiers.interpreter import VerifiersMissingError
from fullasync_agents.verifiers.rows import Row, verifiers_rows

log = logging.getLogger("fullasync")

__all__ = ["KEY", "VerifiersEpisodeError", "VerifiersGenerator", "VerifiersMissingError", "VerifiersSpec",
           "VerifiersWorkerError", "verifiers_rows", "verifiers_task"]


def verifiers_task(env_id: str, env_args: Mapping[str, JsonValue], model: str,
                   ) -> tuple[VerifiersGenerator, list[Row], list[Row]]:
    """`data.task=verifiers:<env_id>`: the environment's generator, training rows and held-out rows (its eval
    dataset; none for a rubric that scores groups, whose episodes have no reward of their own to hold out)."""
    spec = VerifiersSpec(env_id, dict(env_args), model=model)
    train, held_out, grouped = verifiers_rows(spec)
    if not train:
        raise ValueError(f"data.task=verifiers:{env_id}: the environment has no training dataset")
    if grouped and held_out:
        log.info("verifiers environment %s scores groups: its eval rows are not held out (an episode of it has no "
                 "reward of its own; pass evaluate_fn for a held-out score)", env_id)
        held_out = []
    return VerifiersGenerator(spec), train, held_out
