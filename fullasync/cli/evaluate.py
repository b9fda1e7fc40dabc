"""`fullasync eval`: a model's score on a dataset through the user's harness, with its standard error.

Owns: `evaluate_model` — the model (`model.path`, resolved as a run resolves it), the harness (`rollout_fn`,
`data.rollout_fn` or the task's) and the rows (`data.val_dataset` or the task's held-out rows), each row
sampled `val_samples_per_row` times on engines that serve one weight version for the whole evaluation (no
push ever reaches them) — and the report: score ± standard error over rows, failed episodes, and every
row's rewards in `output_dir/eval.json`. A `CustomGenerator` gets its set-up, tear-down and, when it uses
one, the HTTP gateway, as in training. Does not own: the episodes' scoring (`fullasync.run.validation`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fullasync.api import AsyncAgentTrainer
from fullasync.client import RolloutService
from fullasync.config import RunConfig
from fullasync.contracts.engine import Engine
from fullasync.data import load_rows, resolve_dotted
from fullasync.engines.vllm import launch_vllm_engines
from fullasync.gateway import Gateway
from fullasync.infra.heap import settled_heap
from fullasync.infra.runtime import init_ray
from fullasync.launch.model import resolve_model_path
from fullasync.launch.parts import check_chat_setup, client_config, engine_config
from fullasync.models import load_tokenizer
from fullasync.rollout.curriculum import rows_in_pools
from fullasync.rollout.generator import CustomGenerator, RolloutFn, as_generator, run_harness
from fullasync.run.assemble import episodes_on
from fullasync.run.validation import ValidationResult, evaluate
from fullasync.types import JsonValue

log = logging.getLogger("fullasync")


@dataclass(frozen=True)
class EvalReport:
    model: str
    score: float
    stderr: float
    rows: int
    samples_per_row: int
    failed: int
    first_error: str | None
    weight_version: int  # the one version every episode was sampled with
    row_rewards: tuple[tuple[float, ...], ...]

    def line(self) -> str:
        failed = f", {self.failed} failed (scored 0; first: {self.first_error})" if self.failed else ""
        return (f"score {self.score:.3f} ± {self.stderr:.3f} over {self.rows} rows × {self.samples_per_row} samples "
                f"(weight version {self.weight_version}){failed}")

    def to_json(self) -> dict[str, JsonValue]:
        return {"model": self.model, "score": self.score, "stderr": self.stderr, "rows": self.rows,
                "samples_per_row": self.samples_per_row, "failed": self.failed, "first_error": self.first_error,
                "weight_version": self.weight_version,
                "per_row": [{"row": index, "rewards": list(rewards), "mean": sum(rewards) / len(rewards)}
                            for index, rewards in enumerate(self.row_rewards)]}


def eval_inputs(config: RunConfig, rollout_fn: RolloutFn | None,
                rows: Iterable[object] | None) -> tuple[RolloutFn, list[object]]:
    """The harness and rows to evaluate: those given, else the config's (`data.*`), else the task's."""
    task_rollout, _, task_val = AsyncAgentTrainer._task_defaults(config)
    harness = rollout_fn or task_rollout or (resolve_dotted(config.data.rollout_fn, "data.rollout_fn")
                                             if config.data.rollout_fn else None)
    if harness is None:
        raise ValueError("no rollout_fn to evaluate with: set data.rollout_fn=package.module:name or "
                         "data.task=arithmetic (or pass rollout_fn=...)")
    if rows is None:
        rows = (load_rows(config.data.val_dataset, "data.val_dataset", default_split=None)
                if config.data.val_dataset else task_val)
    if rows is None:
        raise ValueError("no rows to evaluate: set data.val_dataset (a file, a dataset or package.module:name) or "
                         "data.task=arithmetic "
                         "(or pass rows=...)")
    listed = list(rows)
    if not listed:
        raise ValueError("the evaluation dataset is empty")
    return harness, listed


async def evaluate_model(config: RunConfig, rollout_fn: RolloutFn | None = None, rows: Iterable[object] | None = None,
                         engines: Sequence[Engine] | None = None) -> EvalReport:
    """Score `config.model` on the rows; `engines` already started by the caller are used and left running."""
    config.validate()
    rows_in_pools([], [], config.eval_keep, 0.0)  # refuses a pool eval_keep cannot name before engines start
    harness, listed = eval_inputs(config, rollout_fn, rows)
    generator = as_generator(harness)  # refuses a non-async function before engines start
    model_path = resolve_model_path(config)
    check_chat_setup(config, model_path)
    own_engines = engines is None
    if engines is None:
        init_ray(log_to_driver=config.worker_logs)
        engines = await launch_vllm_engines(engine_config(config, model_path), config.engine.num_engines)
    try:
        versions = set(await asyncio.gather(*(engine.version() for engine in engines)))
        if len(versions) != 1:
            raise RuntimeError(f"the engines serve different weight versions {sorted(versions)}: evaluate on "
                               "engines that all serve one")
        service = RolloutService(engines, load_tokenizer(model_path), client_config(config))
        result = await _score(config, generator, service, listed)
        after = set(await asyncio.gather(*(engine.version() for engine in engines)))
        if after != versions:
            raise RuntimeError(f"the engines' weights changed during the evaluation ({versions} → {after}): "
                               "evaluate on engines nothing else pushes to")
    finally:
        if own_engines:
            await asyncio.gather(*(engine.shutdown() for engine in engines), return_exceptions=True)
    report = EvalReport(model=config.model.path, score=result.score, stderr=result.stderr, rows=len(listed),
                        samples_per_row=config.val_samples_per_row, failed=result.failed,
                        first_error=result.first_error, weight_version=versions.pop(),
                        row_rewards=result.row_rewards)
    output = Path(config.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "eval.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
    if config.eval_keep:
        write_kept_rows(output / "kept_rows.jsonl", listed, report.row_rewards, config)
    return report


def write_kept_rows(path: Path, rows: Sequence[object], row_rewards: Sequence[Sequence[float]],
                    config: RunConfig) -> None:
    """The rows in `config.eval_keep`'s pools as JSON lines: a training dataset (`data.train_dataset=...`)."""
    kept = rows_in_pools(rows, row_rewards, config.eval_keep, config.data.curriculum_pass_reward)
    try:
        lines = "".join(json.dumps(row) + "\n" for row in kept)
    except TypeError as error:
        raise ValueError(f"eval_keep writes rows as JSON lines; a row is not JSON: {error}") from error
    path.write_text(lines)
    log.info("kept %d of %d rows (%s) in %s", len(kept), len(rows), "+".join(config.eval_keep), path)


async def _score(config: RunConfig, generator: CustomGenerator, service: RolloutService,
                 rows: list[object]) -> ValidationResult:
    """The harness's episodes on `service` (a CustomGenerator set up, and on the gateway if it uses one)."""
    gateway = Gateway(service) if generator.uses_gateway else None
    context = episodes_on(gateway) if gateway is not None else None
    await generator.setup()
    try:
        if gateway is not None:
            await gateway.start()
        try:
            with settled_heap():  # as a run's driver: thousands of episodes' objects, few collections
                return await evaluate(service, lambda client, row: run_harness(generator, context, client, row), rows,
                                      config.val_samples_per_row, config.rollout.episode_timeout_s)
        finally:
            if gateway is not None:
                await gateway.stop()
    finally:
        await generator.teardown()
