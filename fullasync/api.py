"""`AsyncAgentTrainer`: the Python entry point of a training run.

Owns: resolving the run's inputs (model, rollout_fn, datasets), starting and stopping the engines and
the trainer (in `try/finally`, with the builders of `fullasync.launch`), and the metrics sink. The run itself is
wired and supervised in `fullasync.run` (`assemble`, `Run`), its steps live in `fullasync/run/loop.py`.

    trainer = AsyncAgentTrainer(RunConfig(mode="fully_async"), rollout_fn=my_rollout,
                                train_dataset=rows, val_dataset=held_out)
    result = trainer.train()
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fullasync.client import RolloutService
from fullasync.client.beside import BesideClient, BesideModel, RemoteModel, ServedModel, beside_models
from fullasync.config import RunConfig, config_fields
from fullasync.data import load_rows, resolve_dotted
from fullasync.engines.vllm import RayEngine, launch_vllm_engines
from fullasync.engines.vllm.args import check_engine_args
from fullasync.infra.heap import settled_heap
from fullasync.infra.placement import cluster_gpus, gpu_blocks, plan_gpus
from fullasync.infra.platform import is_cpu_platform, process_on_cpus
from fullasync.infra.runtime import describe_cluster, init_ray
from fullasync.infra.shm import remove_orphaned_semaphores
from fullasync.launch.beside import ServedModels, run_teacher, served_gpu_blocks
from fullasync.launch.model import resolve_model_path
from fullasync.launch.parts import (
    RESTART_GRACE_S,
    check_chat_setup,
    client_config,
    engine_config,
    log_layout,
    start_trainer,
)
from fullasync.models import load_tokenizer
from fullasync.observe.logs import configure_logging, progress, progress_display
from fullasync.observe.metrics import MetricsSink
from fullasync.observe.samples import RolloutSamples
from fullasync.observe.tracking import TrackingSettings, check_loggers, open_loggers
from fullasync.presets import builtin_values_warning, weights_bytes
from fullasync.rollout.curriculum import Curriculum, CurriculumSettings
from fullasync.rollout.generator import CustomGenerator, GroupRewardFunction, RewardFunction, as_generator
from fullasync.rollout.rollouter import RolloutFn
from fullasync.rollout.teacher import EndpointTeacher, TeacherScorer, check_endpoint_teacher
from fullasync.run import checkpoint
from fullasync.run.assemble import assemble
from fullasync.run.checkpoint import Checkpoint, CheckpointPolicy
from fullasync.run.result import LoopResult
from fullasync.run.runner import Run, RunSettings
from fullasync.run.validation import Evaluation as Evaluation  # re-exported: `fullasync.Evaluation`
from fullasync.run.validation import Evaluator
from fullasync.tasks.catalog import built_task
from fullasync.types import JsonValue
from fullasync.weights.transport import weight_transport

if TYPE_CHECKING:
    from fullasync.contracts.engine import Engine
    from fullasync.trainer.verl_trainer import VerlTrainer

log = logging.getLogger("fullasync")

T = TypeVar("T")


def _row_id(row: object, index: int) -> str:
    if isinstance(row, dict) and "id" in row:
        return str(row["id"])
    return f"row-{index}"


class AsyncAgentTrainer:
    """Trains `rollout_fn` on `train_dataset` with the mode and knobs of `config`."""

    def __init__(self, config: RunConfig, rollout_fn: RolloutFn | None = None,
                 train_dataset: Iterable[object] | None = None, val_dataset: Iterable[object] | None = None,
                 resume: str | None = None, evaluate_fn: Evaluator | None = None,
                 group_reward_fn: GroupRewardFunction | None = None, reward_fn: RewardFunction | None = None,
                 beside: Mapping[str, BesideModel] | None = None) -> None:
        """`group_reward_fn(row, trajectories)`: the rewards of a row's episodes scored together, one per trajectory in
        episode order, in place of those `rollout_fn` returned (`CustomGenerator.group_rewards`; or set
        `data.group_reward_fn`). `reward_fn(judge, row, trajectory)`: each training episode's reward given after it
        ended by the run's model of role judge (`CustomGenerator.reward`; or set `data.reward_fn`), held-out evaluation
        keeping the episode's own. `beside`: models the harness or a reward calls beside the policy, by name (a judge:
        `client.judge`), never recorded or trained: an endpoint (`RemoteModel`) or one the run serves on engines of
        its own (`ServedModel`). `resume` overrides `config.resume`: "auto" (continue output_dir's
        newest checkpoint, if any), "never", or a checkpoint directory. `evaluate_fn(service)`: a held-out evaluation of
        your own, returning an `Evaluation` (score, standard error, metrics), run before training, every `val_every`
        steps and after, with training generation paused; in place of the mean reward of `rollout_fn`
        on `val_dataset`."""
        if resume is not None:
            config.resume = resume
        config.validate()
        check_engine_args(config.engine.vllm)  # before anything starts
        self.config = config
        task_rollout, task_train, task_val = self._task_defaults(config)
        if rollout_fn is None and task_rollout is None and not config.data.rollout_fn:
            raise ValueError("no rollout_fn: pass rollout_fn=..., or set data.rollout_fn=package.module:name, "
                             "or data.task=arithmetic")
        if train_dataset is None and task_train is None and not config.data.train_dataset:
            raise ValueError("no training rows: pass train_dataset=..., or set data.train_dataset (a file, a dataset "
                             "or package.module:name), "
                             "or data.task=arithmetic")
        self.rollout_fn = rollout_fn or task_rollout or resolve_dotted(config.data.rollout_fn, "data.rollout_fn")
        group_reward_fn = group_reward_fn or (resolve_dotted(config.data.group_reward_fn, "data.group_reward_fn")
                                              if config.data.group_reward_fn else None)
        reward_fn = reward_fn or (resolve_dotted(config.data.reward_fn, "data.reward_fn")
                                  if config.data.reward_fn else None)
        # refuses a non-async function here, before anything starts
        self.generator = as_generator(self.rollout_fn, group_reward_fn, reward_fn)
        train = train_dataset if train_dataset is not None else task_train
        val = val_dataset if val_dataset is not None else task_val
        if train is None:
            train = load_rows(config.data.train_dataset, "data.train_dataset")
        if val is None and config.data.val_dataset:
            val = load_rows(config.data.val_dataset, "data.val_dataset", default_split=None)
        self.train_rows = list(train)
        if config.data.max_train_rows:
            self.train_rows = self.train_rows[:config.data.max_train_rows]
        self.val_rows = list(val) if val is not None else None
        self.evaluate_fn = evaluate_fn
        self.beside = {**beside_models(config.beside), **(beside or {})}  # checked here, before anything starts
        judges = [name for name, model in self.beside.items() if model.role == "judge"]
        if reward_fn is not None and len(judges) != 1:
            raise ValueError(f"reward_fn(judge, row, trajectory) needs exactly one model of role judge beside the "
                             f"policy, the run has {len(judges)} ({judges}): add beside.judge.path=<model> (served by "
                             "the run) or beside.judge.base_url=... beside.judge.model=... (an endpoint)")
        if not self.train_rows:
            raise ValueError("the training dataset is empty")
        data = config.data
        self.curriculum = (CurriculumSettings(weights=dict(data.curriculum_weights), floor=data.curriculum_floor,
                                              window=data.curriculum_window, pass_reward=data.curriculum_pass_reward,
                                              draws=data.epochs * len(self.train_rows), seed=config.seed)
                           if data.curriculum else None)  # its settings checked here, before anything starts

    @staticmethod
    def _task_defaults(config: RunConfig) -> tuple[RolloutFn | None, Iterable[object] | None, Iterable[object] | None]:
        task = built_task(config)
        if task is None:
            return None, None, None
        if not isinstance(task.rollout_fn, CustomGenerator) and not callable(task.rollout_fn):
            raise TypeError(f"data.task={config.data.task!r} gave no harness: {task.rollout_fn!r}")
        return cast(RolloutFn, task.rollout_fn), task.train_rows, task.val_rows

    def model_path(self) -> str:
        """The directory engines and trainer load (`resolve_model_path`), its chat template checked against the
        client's parsers (`check_chat_setup`)."""
        path = resolve_model_path(self.config)
        check_chat_setup(self.config, path)
        return path

    def train(self) -> LoopResult:
        """Run the training in a new event loop; on a terminal with live progress bars (`progress_display`)."""
        configure_logging()
        with progress_display():
            return asyncio.run(self.train_async())

    def _row_source(self) -> Iterable[tuple[str, object]]:
        """The rows the run draws: in dataset order, `data.epochs` times, or sampled by a curriculum."""
        if self.curriculum is None:
            return self._rows()
        return Curriculum([(_row_id(row, index), row) for index, row in enumerate(self.train_rows)], self.curriculum)

    def _rows(self) -> Iterable[tuple[str, object]]:
        for epoch in range(self.config.data.epochs):
            for index, row in enumerate(self.train_rows):
                row_id = _row_id(row, index)
                yield (row_id if self.config.data.epochs == 1 else f"{row_id}@{epoch}"), row

    def tracking_settings(self) -> TrackingSettings:
        section = self.config.logging
        return TrackingSettings(tuple(section.loggers), section.project, section.run_name, section.offline,
                                Path(self.config.output_dir))

    @property
    def checkpoint_root(self) -> Path:
        return Path(self.config.output_dir) / "checkpoints"

    def fingerprint(self) -> dict[str, JsonValue]:
        """What a checkpoint of this run records and a resuming run must match: the config's fixed fields and
        the training rows (their number, and a digest of their ids and contents)."""
        digest = hashlib.sha256()
        for row_id, row in self._rows():
            digest.update(json.dumps([row_id, row], sort_keys=True, default=repr).encode())
        return {**self.config.fingerprint(), "data.num_rows": len(self.train_rows),
                "data.rows_sha256": digest.hexdigest()}

    def resumable(self) -> Checkpoint | None:
        """The checkpoint this run continues (per `resume`), checked against this run; None: a fresh start."""
        removed = checkpoint.remove_interrupted_saves(self.checkpoint_root)
        if removed:
            log.warning("removed %d checkpoint(s) a crash interrupted while saving: %s", len(removed), removed)
        return checkpoint.find_resumable(self.checkpoint_root, self.config.resume, self.fingerprint())

    async def train_async(self, engines: Sequence[Engine] | None = None,
                          trainer: VerlTrainer | None = None) -> LoopResult:
        """Run the training; `engines` / `trainer` already started by the caller are reused and left running."""
        from fullasync.trainer.verl_trainer import VerlTrainer

        cfg = self.config
        check_loggers(self.tracking_settings())  # before starting anything: a missing logger fails in a second
        resume = self.resumable()  # before starting anything: an incompatible checkpoint fails fast
        began = time.perf_counter()
        model_path = self.model_path()
        teacher = run_teacher(self.beside, model_path, cfg.engine.max_model_len)  # before anything starts
        endpoint = await checked_endpoint(self.beside[teacher], teacher, model_path, cfg.engine.max_model_len) \
            if teacher else None
        log.info("model ready: %s%s (%.1f s)", cfg.model.path, "" if model_path == cfg.model.path
                 else f" → {model_path}", time.perf_counter() - began, extra=progress("model", 1, 1))
        toy_values = builtin_values_warning(cfg, weights_bytes(Path(model_path)))
        if toy_values:
            log.warning("%s", toy_values)
        began, started_at = time.perf_counter(), time.time()
        init_ray(log_to_driver=cfg.worker_logs)
        log.info("Ray ready: %s (%.1f s)", describe_cluster(), time.perf_counter() - began,
                 extra=progress("ray", 1, 1))
        own_engines, own_trainer = engines is None, trainer is None
        served = {name: spec for name, spec in self.beside.items() if isinstance(spec, ServedModel)}
        if not is_cpu_platform():  # before starting anything: a layout that cannot fit fails at once
            plan_gpus([*gpu_blocks(cfg.engine.num_engines if own_engines else 0, cfg.engine.tensor_parallel_size,
                                   cfg.trainer.num_workers if own_trainer else 0), *served_gpu_blocks(served)],
                      cluster_gpus())
        if trainer is None:
            trainer = VerlTrainer(model_path, cfg.resolved_trainer())
        started = await asyncio.gather(
            launch_vllm_engines(engine_config(cfg, model_path), cfg.engine.num_engines) if engines is None
            else _ready(engines),
            start_trainer(trainer) if own_trainer else _ready(None),
            ServedModels.start(served, cfg.seed),
            return_exceptions=True,
        )
        engines = started[0] if not isinstance(started[0], BaseException) else []
        beside = started[2] if isinstance(started[2], ServedModels) else ServedModels()
        try:
            for outcome in started:
                if isinstance(outcome, BaseException):
                    raise outcome
            await log_layout(cast("list[RayEngine]", engines) if own_engines else [], trainer if own_trainer else None)
            with process_on_cpus("rollout.cpus", cfg.rollout.cpus):  # after Ray's and the workers' processes started
                if cfg.rollout.cpus:
                    log.info("this process (rollouter, client, rollout_fn, loop) on cores %s (rollout.cpus)",
                             cfg.rollout.cpus)
                scorer = teacher_scorer(beside, teacher, self.beside[teacher], endpoint) if teacher else None
                return await self._run(engines, trainer, model_path, resume, beside, scorer)
        finally:
            await self._shutdown([trainer] if own_trainer else [], engines if own_engines else [])
            await beside.shutdown()
            if endpoint is not None:
                await endpoint.close()
            if own_engines or own_trainer:
                remove_orphaned_semaphores(since=started_at)

    @staticmethod
    async def _shutdown(trainers: list, engines: Sequence[Engine]) -> None:
        """Stop what this run started; a component that fails to stop is logged, the others still stop."""
        stopping = [*(t.shutdown() for t in trainers), *(e.shutdown() for e in engines)]
        for outcome in await asyncio.gather(*stopping, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.warning("shutdown: %r", outcome)

    async def _run(self, engines: Sequence[Engine], trainer: Any, model_path: str,
                   resume: Checkpoint | None, served: ServedModels, teacher: TeacherScorer | None = None) -> LoopResult:
        # `trainer: Any`, not VerlTrainer: its export_weights may return StreamedWeights, which the Trainer
        # contract's WeightsPayload (fullasync/contracts/run.py) does not name yet, so `assemble` would refuse it
        cfg = self.config
        output_dir = Path(cfg.output_dir)
        tokenizer = load_tokenizer(model_path)
        loggers = open_loggers(self.tracking_settings(), {f.name: f.value for f in config_fields(cfg)},
                               resume=resume is not None)
        sink = MetricsSink(output_dir / "metrics.jsonl", loggers,
                           RolloutSamples(output_dir / "rollouts", tokenizer, cfg.logging.samples_every))
        beside = {name: served.clients[name] if isinstance(spec, ServedModel) else BesideClient(name, spec)
                  for name, spec in self.beside.items()}
        service = RolloutService(engines, tokenizer, client_config(cfg), beside=beside)
        try:
            policy = CheckpointPolicy(self.checkpoint_root, cfg.checkpoint.every, cfg.checkpoint.keep,
                                      self.fingerprint(), hf_every=cfg.checkpoint.save_hf_every)
            run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=self.generator,
                                 settings=RunSettings.from_config(cfg), sink=sink, val_rows=self.val_rows,
                                 checkpoints=policy, transport=weight_transport(cfg.trainer.weight_transport, trainer),
                                 evaluator=self.evaluate_fn,
                                 teacher=teacher)
            log.info("mode=%s max_staleness=%d push=%s batch=%d×%d rows=%d×%d epochs", cfg.mode, cfg.staleness,
                     cfg.push_mode.value, cfg.rollout.batch_size, cfg.rollout.n, len(self.train_rows), cfg.data.epochs)
            log.info(cfg.correction_summary(trainer.config))
            with settled_heap(), _stop_on_signals(run):
                result = await run.execute(self._row_source(), resume=resume)
            if cfg.save_checkpoint and not result.interrupted:
                await trainer.save_checkpoint(str(output_dir / "checkpoint"))
            write_result(output_dir / "result.json", result)
            write_rows(output_dir / "rows.jsonl", run.rollouter.ledger.row_records())
            return result
        finally:
            sink.close()


def teacher_scorer(served: ServedModels, name: str, spec: BesideModel,
                   endpoint: EndpointTeacher | None) -> TeacherScorer:
    """The scorer of the teacher `name`: on its engines (a served one, giving up when their supervisor does) or its
    endpoint."""
    if endpoint is not None:
        return TeacherScorer(name, [endpoint], max_concurrency=spec.max_concurrency, retries=spec.retries,
                             backoff_s=spec.backoff_s)
    assert isinstance(spec, ServedModel)
    return TeacherScorer(name, served.engines(name), check=served.check(name), max_concurrency=spec.max_concurrency,
                         retries=spec.retries, backoff_s=spec.backoff_s,
                         restart_wait_s=spec.start_timeout_s + RESTART_GRACE_S)


async def checked_endpoint(spec: BesideModel, name: str, model_path: str, max_model_len: int) -> EndpointTeacher | None:
    """A teacher behind an endpoint, once it showed the policy's tokenizer and a long enough context; None for a
    teacher the run serves (`run_teacher` checked it)."""
    if not isinstance(spec, RemoteModel):
        return None
    api_key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
    endpoint = EndpointTeacher(name, spec.base_url, spec.model, api_key, spec.timeout_s)
    await check_endpoint_teacher(endpoint, load_tokenizer(model_path), max_model_len, api_key)
    return endpoint


async def _ready(value: T) -> T:
    return value


@contextlib.contextmanager
def _stop_on_signals(run: Run) -> Iterator[None]:
    """SIGTERM / SIGINT ask the run to checkpoint and stop (a second one stops it at once); main thread only."""
    loop = asyncio.get_running_loop()
    handled = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, run.request_stop, signal.Signals(signum).name)
            handled.append(signum)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
            pass
    try:
        yield
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def write_rows(path: Path, records: Iterable[Mapping[str, object]]) -> None:
    """Every row's outcome and what it generated (episodes, calls, output tokens, resumed calls), one per line:
    what the length-bias account reads (which rows were generated, trained, dropped or resumed, by length)."""
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def write_result(path: Path, result: LoopResult) -> None:
    """The run's account as JSON: the summary, accuracy before/after, and what became of every row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**result.summary(), "trained_rows_seen_twice": result.trained_rows_seen_twice,
                                "row_outcomes": result.row_outcomes}, indent=1))
