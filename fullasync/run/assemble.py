"""One run, wired in one place: `assemble(...)` builds its components, `Run.execute(rows)` (`runner.py`) runs them.

Owns: the construction of the weight sync, the staleness manager (with this run's version as its source), the
queue (sized here, and only here), the rollouter and the HTTP gateway when the harness uses one (the rollouter gets
only `OpenEpisode`, each episode's URL on it); the start-up check of `rollout_fn`; the version the engines serve
when a run starts. Does not own: starting engines or the trainer (the caller does, and keeps them), the order of a
run (`runner.py`) or any step logic (`loop.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from fullasync.client import RolloutClient, RolloutService
from fullasync.contracts.engine import Engine
from fullasync.contracts.run import GroupQueue, Trainer
from fullasync.contracts.weights import WeightTransport
from fullasync.errors import EngineDiedError
from fullasync.gateway import Gateway
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.generator import EpisodeContext, OpenEpisode, as_generator
from fullasync.rollout.rollouter import Rollouter, RolloutFn
from fullasync.rollout.staleness import StalenessManager
from fullasync.rollout.teacher import TeacherScorer
from fullasync.run.checkpoint import CheckpointPolicy
from fullasync.run.queue import MessageQueue, RayGroupQueue
from fullasync.run.runner import Run, RunParts, RunSettings
from fullasync.run.validation import Evaluator
from fullasync.weights.sync import WeightSync


async def assemble(*, engines: Sequence[Engine], trainer: Trainer, service: RolloutService, rollout_fn: RolloutFn,
                   settings: RunSettings, sink: MetricsSink, val_rows: Sequence[Any] | None = None,
                   checkpoints: CheckpointPolicy | None = None, transport: WeightTransport | None = None,
                   evaluator: Evaluator | None = None, teacher: TeacherScorer | None = None) -> Run:
    """Wire one run on engines and a trainer that the caller started (and will stop); `transport`: how pushes
    travel (default: the object store, `weights/transport.py`); `teacher`: scores every group before it is queued
    (on-policy distillation, on engines the caller started)."""
    generator = as_generator(rollout_fn)
    weight_sync = WeightSync(engines, mode=settings.push_mode, version=await serving_version(engines),
                             restart_on_failure=settings.restart_engines, transport=transport,
                             in_flight=service.router.load)
    # admission counts the versions of this run only (a resumed run: from its first run's start)
    staleness = StalenessManager(settings.max_staleness, settings.batch_size, settings.rollout.max_running_rows,
                                 version=lambda: weight_sync.version - weight_sync.start_version,
                                 count_running=settings.admission, generate_ahead=settings.generate_ahead)
    queue: GroupQueue = (MessageQueue(settings.queue_capacity, hand_over=settings.hand_over)
                         if settings.queue_in_process else RayGroupQueue(settings.queue_capacity, settings.hand_over))
    gateway = (Gateway(service, host=settings.gateway_host, join_retries=settings.join_identical_requests)
               if generator.uses_gateway else None)
    rollouter = Rollouter(generator, service, queue, staleness, settings.rollout,
                          episode_context=episodes_on(gateway) if gateway is not None else None, teacher=teacher)
    return Run(RunParts(rollouter, queue, weight_sync, trainer, gateway), settings, sink, val_rows, checkpoints,
               evaluator)


async def serving_version(engines: Sequence[Engine]) -> int:
    """The newest version the engines serve, asked of every one not declared dead (engines handed over by a run
    that stopped may include one that died: the run restarts it, `WeightSync.supervise`); 0 when none answers."""
    answers = await asyncio.gather(*(e.version() for e in engines if e.death is None), return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, EngineDiedError):
            raise answer
    return max((answer for answer in answers if isinstance(answer, int)), default=0)


def episodes_on(gateway: Gateway) -> OpenEpisode:
    """Each episode reachable at a base URL of its own on `gateway` while it runs (closed when it ends)."""

    @contextlib.contextmanager
    def open_episode(client: RolloutClient) -> Iterator[EpisodeContext]:
        episode = gateway.open_episode(client=client)
        try:
            yield EpisodeContext(episode.episode_id, client, episode.base_url, episode.api_key, gateway.run_base_url)
        finally:
            gateway.close_episode(episode)

    return open_episode
