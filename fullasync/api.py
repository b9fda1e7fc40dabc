"""`AsyncAgentTrainer`: the Python entry point that wires engines, rollouter, queue and trainer.

Owns: resolving the run's inputs (model, rollout_fn, datasets), starting and stopping every
component (in `try/finally`), and validation. The step logic lives in `trainer/loop.py`.

    trainer = AsyncAgentTrainer(RunConfig(mode="fully_async"), rollout_fn=my_rollout,
                                train_dataset=rows, val_dataset=held_out)
    result = trainer.train()
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fullasync.client import ClientConfig, RolloutService
from fullasync.config import BUILTIN_MODEL, RunConfig
from fullasync.engines.vllm_engine import VLLMEngineConfig, launch_vllm_engines
from fullasync.metrics import MetricsSink
from fullasync.models import load_tokenizer
from fullasync.rollout.generator import CustomGenerator
from fullasync.rollout.rollouter import RolloutFn, Rollouter, RolloutSettings
from fullasync.rollout.staleness import StalenessManager
from fullasync.runtime import init_ray
from fullasync.trainer.loop import LoopResult, TrainingLoop
from fullasync.types import Trajectory
from fullasync.weight_sync import WeightSync


def resolve_dotted(path: str, what: str) -> Any:
    """`package.module:name` → the object; the error says what was looked for."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{what}={path!r} must look like 'package.module:name'")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{what}={path!r} could not be resolved: {error}") from error


def _row_id(row: Any, index: int) -> str:
    if isinstance(row, dict) and "id" in row:
        return str(row["id"])
    return f"row-{index}"


class AsyncAgentTrainer:
    """Trains `rollout_fn` on `train_dataset` with the mode and knobs of `config`."""

    def __init__(self, config: RunConfig, rollout_fn: RolloutFn | None = None,
                 train_dataset: Iterable[Any] | None = None, val_dataset: Iterable[Any] | None = None) -> None:
        config.validate()
        self.config = config
        task_rollout, task_train, task_val = self._task_defaults(config)
        if rollout_fn is None and task_rollout is None and not config.data.rollout_fn:
            raise ValueError("no rollout_fn: pass rollout_fn=..., or set data.rollout_fn=package.module:name, "
                             "or data.task=arithmetic")
        if train_dataset is None and task_train is None and not config.data.train_dataset:
            raise ValueError("no training rows: pass train_dataset=..., or set data.train_dataset=package.module:name, "
                             "or data.task=arithmetic")
        self.rollout_fn = rollout_fn or task_rollout or resolve_dotted(config.data.rollout_fn, "data.rollout_fn")
        train = train_dataset if train_dataset is not None else task_train
        val = val_dataset if val_dataset is not None else task_val
        if train is None:
            train = resolve_dotted(config.data.train_dataset, "data.train_dataset")()
        if val is None and config.data.val_dataset:
            val = resolve_dotted(config.data.val_dataset, "data.val_dataset")()
        if not (callable(self.rollout_fn) or isinstance(self.rollout_fn, CustomGenerator)):
            raise TypeError("rollout_fn must be an async function (client, row) -> float | Trajectory, "
                            "or a fullasync.rollout.generator.CustomGenerator")
        self.train_rows = list(train)
        self.val_rows = list(val) if val is not None else None
        if not self.train_rows:
            raise ValueError("the training dataset is empty")

    @staticmethod
    def _task_defaults(config: RunConfig) -> tuple[Any, Any, Any]:
        if config.data.task == "arithmetic":
            from fullasync.tasks import arithmetic

            task = arithmetic.ArithmeticTask()
            return arithmetic.rollout_fn, task.rows("train"), task.rows("val")
        if config.data.task:
            raise ValueError(f"data.task={config.data.task!r} is not a built-in task; use 'arithmetic' or ''")
        return None, None, None

    def model_path(self) -> str:
        if self.config.model.path == BUILTIN_MODEL:
            from fullasync.tasks.warmup import build_warm_policy

            return str(build_warm_policy())
        if not Path(self.config.model.path).is_dir():
            raise FileNotFoundError(f"model.path={self.config.model.path!r} is not a local model directory")
        return self.config.model.path

    def train(self) -> LoopResult:
        return asyncio.run(self.train_async())

    def _rows(self) -> Iterable[tuple[str, Any]]:
        for epoch in range(self.config.data.epochs):
            for index, row in enumerate(self.train_rows):
                row_id = _row_id(row, index)
                yield (row_id if self.config.data.epochs == 1 else f"{row_id}@{epoch}"), row

    async def train_async(self, engines: list | None = None, trainer: Any = None) -> LoopResult:
        """Run the training; `engines` / `trainer` already started by the caller are reused and left running."""
        from fullasync.trainer.verl_trainer import VerlTrainer

        cfg = self.config
        model_path = self.model_path()
        init_ray()
        own_engines, own_trainer = engines is None, trainer is None
        if own_trainer:
            trainer = VerlTrainer(model_path, cfg.resolved_trainer())
        engine_config = VLLMEngineConfig(
            model_path=model_path, served_model_name=cfg.model.served_name, dtype=cfg.engine.dtype,
            max_model_len=cfg.engine.max_model_len, max_num_seqs=cfg.engine.max_num_seqs, seed=cfg.seed,
            stall_timeout_s=cfg.engine.stall_timeout_s, probe_interval_s=cfg.engine.probe_interval_s,
        )
        started = await asyncio.gather(
            launch_vllm_engines(engine_config, cfg.engine.num_engines) if own_engines else _ready(engines),
            trainer.start() if own_trainer else _ready(None),
            return_exceptions=True,
        )
        engines = started[0] if not isinstance(started[0], BaseException) else []
        try:
            for outcome in started:
                if isinstance(outcome, BaseException):
                    raise outcome
            return await self._run(engines, trainer, model_path)
        finally:
            await asyncio.gather(
                *([trainer.shutdown()] if own_trainer else []),
                *([e.shutdown() for e in engines] if own_engines else []),
                return_exceptions=True,
            )

    async def _run(self, engines: list, trainer: Any, model_path: str) -> LoopResult:
        import ray

        from fullasync.queue import MessageQueue

        cfg = self.config
        k, batch = cfg.staleness, cfg.rollout.batch_size
        queue = ray.remote(MessageQueue).options(num_cpus=0).remote((k + 1) * batch + cfg.rollout.max_running_rows)
        output_dir = Path(cfg.output_dir)
        sink = MetricsSink(output_dir / "metrics.jsonl", output_dir / "tensorboard" if cfg.tensorboard else None,
                           cfg.wandb_project or None)
        service = RolloutService(engines, load_tokenizer(model_path), ClientConfig(
            model_name=cfg.model.served_name, max_model_len=cfg.engine.max_model_len,
            resume_timeout_s=cfg.rollout.resume_timeout_s))
        weight_sync = WeightSync(engines, mode=cfg.push_mode, version=await engines[0].version())
        first_version = weight_sync.version  # admission counts versions of this run only
        staleness = StalenessManager(k, batch, cfg.rollout.max_running_rows,
                                     version=lambda: weight_sync.version - first_version)
        rollouter = Rollouter(self.rollout_fn, service, queue, staleness, RolloutSettings(
            n=cfg.rollout.n, max_running_rows=cfg.rollout.max_running_rows,
            episode_timeout_s=cfg.rollout.episode_timeout_s, filter_zero_variance=cfg.rollout.filter_zero_variance))
        print(f"[fullasync] mode={cfg.mode} max_staleness={k} push={cfg.push_mode.value} "
              f"batch={batch}×{cfg.rollout.n} rows={len(self.train_rows)}×{cfg.data.epochs} epochs", flush=True)
        print(f"[fullasync] {cfg.correction_summary(trainer.config)}", flush=True)
        loop = TrainingLoop(
            trainer=trainer, rollouter=rollouter, queue=queue, weight_sync=weight_sync, staleness=staleness,
            batch_size=batch, total_steps=cfg.total_steps, val_every=cfg.val_every,
            validate=(lambda: evaluate(service, rollouter.run_harness, self.val_rows, cfg.val_samples_per_row,
                                       cfg.rollout.episode_timeout_s))
            if self.val_rows else None,
            sink=sink,
        )
        try:
            await rollouter.open()
            rollouter.start(self._rows())
            result = await loop.run()
            if cfg.save_checkpoint:
                await trainer.save_checkpoint(str(output_dir / "checkpoint"))
            return result
        finally:
            await rollouter.close()
            sink.close()
            ray.kill(queue)


async def _ready(value: Any) -> Any:
    return value


async def evaluate(service: RolloutService, run_harness: Any, rows: list[Any], samples_per_row: int,
                   episode_timeout_s: float, concurrency: int = 64) -> float:
    """Mean reward of `samples_per_row` episodes per row; failures (and episodes past the timeout) count as 0."""
    limit = asyncio.Semaphore(concurrency)

    async def one(index: int, row: Any, sample: int) -> float:
        async with limit:
            client = service.client(f"val-{index}-{sample}")
            try:
                result = await asyncio.wait_for(run_harness(client, row), episode_timeout_s)
                return float(result.reward if isinstance(result, Trajectory) else result)
            finally:
                client.close()

    rewards = await asyncio.gather(
        *(one(i, row, s) for (i, row), s in itertools.product(enumerate(rows), range(samples_per_row))),
        return_exceptions=True,
    )
    return sum(r for r in rewards if isinstance(r, float)) / len(rewards)
