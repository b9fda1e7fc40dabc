"""One rank of the trainer: a Ray actor hosting verl TrainingWorkers (the policy, optionally a reference).

Owns: the process's set-up (torch threads, the verl CPU platform, torch.distributed through
verl), log-prob inference on this rank's rows, the update loop over epochs and mini-batches
(proximal log-probs when the correction recomputes them, reference log-probs, verl's `ppo_loss`
behind the off-policy correction, one optimizer step per mini-batch),
weight export and HF checkpoints. Does not own: splitting batches across ranks or waiting on
ranks (`WorkerGroup`, `VerlTrainer`).

Every rank must receive the same calls in the same order: the FSDP collectives inside verl
(parameter all-gathers, gradient reduce-scatters, export's full_tensor) pair up across ranks.
`verl.workers` is imported in `setup()` only, after the CPU platform patch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fullasync.config import TrainerConfig
from fullasync.infra.memory import PeakMemory
from fullasync.infra.placement import where_am_i
from fullasync.infra.platform import bind_to_cpus
from fullasync.trainer.batch import TrainBatch, sequence_gradient_scales
from fullasync.trainer.corrections import GRADIENT_SCALES, CorrectionStats
from fullasync.trainer.lora import merged_lora_weights
from fullasync.trainer.prefix_sharing import SharedPrefixDecoder, install

if TYPE_CHECKING:  # verl.workers loads after the CPU platform patch (see `setup`)
    from verl.workers.engine_workers import TrainingWorker

    from fullasync.trainer.corrections import CorrectedPolicyLoss
    from fullasync.weights.stream import Metadata, StreamPlan

LOOPBACK = "127.0.0.1"
TIED_OUTPUT_WEIGHT = "lm_head.weight"
INPUT_EMBEDDING_WEIGHT = "model.embed_tokens.weight"
# verl metric name → our name; metrics not listed (perf/*, mfu, kl_coef) are dropped
METRIC_NAMES = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "actor/pg_loss": "pg_loss",
    "actor/pg_clipfrac": "pg_clipfrac",
    "actor/pg_clipfrac_lower": "pg_clipfrac_lower",
    "actor/ppo_kl": "ppo_kl",
    "actor/entropy_loss": "entropy",
    "kl_loss": "kl_loss",
}


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank needs to build its model."""

    model_path: str  # HF model directory the policy (and reference) start from
    config: TrainerConfig
    on_cpu: bool  # apply the verl CPU platform patch (gloo, fp32) before importing verl.workers
    threads: int  # torch intra-op threads in this process


@dataclass(frozen=True)
class StepPart:
    """Where a `train` call stands in its step. A step whose batch is taken in two parts (the last groups bound
    when the trainer reaches them, `Batcher.late_places`) makes one update over both: the first part zeroes
    the gradients and does not step; the second first rescales what the first accumulated and steps. With N the
    step's loss normaliser (tokens for token-mean, episodes for the seq-mean modes: `batch.loss_normaliser`) and
    N₁, N₂ the parts', the first part's gradient (normalised by N₁) is scaled by N₁/N and the second's loss by
    N₂/N: the sum is the gradient of the whole batch normalised by N, the same update as one call on both parts."""

    first: bool = True  # zero the gradients before it
    last: bool = True  # clip, step the optimizer (and the LR scheduler) after it
    earlier_scale: float = 1.0  # the gradients accumulated by the earlier part are multiplied by this first
    loss_scale: float = 1.0  # this part's loss is multiplied by this


WHOLE_STEP = StepPart()


@dataclass(frozen=True)
class RankStepResult:
    """What one rank's `train` returns: its metrics and its share of the correction's statistics."""

    metrics: dict[str, float]  # verl's metrics averaged over updates, log-prob gap sums, timings
    correction_stats: CorrectionStats  # of the first pass over the mini-batches (each sampled token once)


class TrainerWorker:
    """Ray actor body for one rank; `setup()` must run on all ranks together (rendezvous)."""

    def __init__(self, rank: int, world_size: int, spec: WorkerSpec) -> None:
        self.rank = rank
        self.world_size = world_size
        self.spec = spec
        if spec.config.cpus:
            bind_to_cpus("trainer.cpus", spec.config.cpus, ranks=world_size, rank=rank)
        torch.set_num_threads(spec.threads)
        torch.manual_seed(spec.config.seed)
        self._policy: TrainingWorker | None = None
        self._reference: TrainingWorker | None = None  # with kl_coef > 0: the frozen starting policy
        self._loss: CorrectedPolicyLoss | None = None
        self._shared_prefixes: SharedPrefixDecoder | None = None  # the policy's decoder, with share_prefixes

    def free_port(self) -> int:
        """A port free on this node's loopback now (rank 0 hosts the rendezvous there)."""
        from fullasync.weights.stream import free_ports

        return free_ports(LOOPBACK, 1)[0]

    def describe(self) -> dict[str, str]:
        """What this rank's policy runs as, read from the model verl built (not from the config): master weights'
        dtype, compute dtype (FSDP's mixed-precision policy), attention, gradient checkpointing, trained share."""
        policy = self._set_up()[0]
        module = _fsdp_module(policy)
        model = getattr(module, "_fsdp_wrapped_module", module)
        parameters = list(model.parameters())
        trained = sum(p.numel() for p in parameters if p.requires_grad)
        total = sum(p.numel() for p in parameters)
        policy_state = getattr(module, "_get_fsdp_state", None)  # torch's FSDP2 state (no public accessor)
        compute = getattr(getattr(policy_state(), "_mp_policy", None), "param_dtype", None) if policy_state else None
        hf_config = getattr(model, "config", None)
        return {
            "master_dtype": _dtype_name(parameters[0].dtype),
            "compute_dtype": _dtype_name(compute or parameters[0].dtype),
            "attention": str(getattr(hf_config, "_attn_implementation", "unknown")),
            "padding_free": str(bool(policy.model_config.use_remove_padding)).lower(),
            "chunked_logprobs": str(_chunked_head(model)).lower(),
            "sequence_parallel": str(getattr(policy.engine, "ulysses_sequence_parallel_size", 1)),
            "cpus": ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))),
            "threads": str(torch.get_num_threads()),
            "gradient_checkpointing": str(bool(getattr(model, "is_gradient_checkpointing", False))).lower(),
            "trained_parameters": f"{trained}/{total}",
            "shared_prefixes": self._shared_prefixes.head if self._shared_prefixes is not None else "off",
        }

    def placement(self) -> tuple[str, list[str]]:
        """This rank's node and the GPU ids Ray assigned it."""
        return where_am_i()

    def setup(self, master_port: int) -> float:
        """Join the process group and load the model(s); returns the seconds it took."""
        start = time.perf_counter()
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
            MASTER_ADDR=LOOPBACK,
            MASTER_PORT=str(master_port),
        )
        with warnings.catch_warnings():  # verl lists every optional engine backend it cannot import
            warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
            if self.spec.on_cpu:
                from fullasync_patches import verl_cpu

                verl_cpu.apply()
            from verl.workers.engine_workers import TrainingWorker

        from fullasync.trainer import attention
        from fullasync.trainer.verl_setup import policy_loss_fn, training_worker_config

        attention.register()

        config = self.spec.config
        self._policy = policy = TrainingWorker(training_worker_config(self.spec.model_path, config,
                                                                      on_cpu=self.spec.on_cpu))
        policy.reset()
        self._loss = policy_loss_fn(config)
        policy.set_loss_fn(self._loss)
        if config.kl_coef > 0:
            reference = training_worker_config(self.spec.model_path, config, on_cpu=self.spec.on_cpu, reference=True)
            self._reference = TrainingWorker(reference)
            self._reference.reset()
        if config.share_prefixes:
            self._shared_prefixes = install(_fsdp_module(policy))
            if self._reference is not None:
                install(_fsdp_module(self._reference))
        return time.perf_counter() - start

    def _set_up(self) -> tuple[TrainingWorker, CorrectedPolicyLoss]:
        """The policy and its loss; a RuntimeError before `setup()` ran."""
        if self._policy is None or self._loss is None:
            raise RuntimeError(f"trainer rank {self.rank}: setup() has not run")
        return self._policy, self._loss

    def log_probs(self, shard: TrainBatch, micro_batch_rows: int = 0) -> torch.Tensor:
        """(rows, R) log-probs of this rank's response tokens under the current policy (`micro_batch_rows` > 0: the
        shard is planned into micro-batches of that many rows, `ShardedBatch.micro_batch_rows`)."""
        return self._infer(self._set_up()[0], shard, micro_batch_rows)

    def train(self, shard: TrainBatch, rows_per_block: int, sequences_per_mini_batch: list[int],
              episodes_per_mini_batch: list[float], trainer_version: int,
              part: StepPart = WHOLE_STEP, micro_batch_rows: int = 0) -> RankStepResult:
        """Proximal (and reference) log-probs, then `ppo_epochs` × `mini_batches` optimizer updates (with
        `part` not whole: its share of one update, which needs one epoch of one mini-batch).

        Block j of `shard` (rows_per_block rows) is this rank's part of mini-batch j;
        `sequences_per_mini_batch[j]` is mini-batch j's real size over all ranks (the
        denominator of verl's sequence-mean loss modes) and `episodes_per_mini_batch[j]` its episodes
        (what the gradient of those modes is a mean over, `batch.sequence_gradient_scales`).
        `trainer_version` is the weight version the trainer holds (the version gaps of the
        correction count from it). The result holds verl's metrics averaged over updates and the
        correction's statistics. `micro_batch_rows` > 0: the blocks are planned into micro-batches of that many rows.
        """
        config = self.spec.config
        policy, loss = self._set_up()
        peak = PeakMemory()
        peak.reset()
        start = time.perf_counter()
        recompute = config.recomputes_proximal
        extra = {"old_log_probs": self._infer(policy, shard, micro_batch_rows) if recompute
                 else shard.behaviour_logprobs}
        if self._reference is not None:
            extra["ref_log_prob"] = self._infer(self._reference, shard, micro_batch_rows)
        prepared = time.perf_counter()
        updates = []
        num_updates = config.ppo_epochs * config.mini_batches
        if part != WHOLE_STEP and num_updates != 1:
            raise ValueError(f"a step in parts makes one update; this trainer makes {num_updates} per step "
                             "(ppo_epochs × mini_batches)")
        loss.drain()
        if self._shared_prefixes is not None:
            self._shared_prefixes.take_counts()  # the log-prob passes' (the update's are reported)
        for update in range(num_updates):
            block = update % config.mini_batches
            rows = torch.arange(block * rows_per_block, (block + 1) * rows_per_block)
            loss.recording = update < config.mini_batches  # each sampled token counted once
            updates.append(self._update(policy, shard.select(rows), {k: v[rows] for k, v in extra.items()},
                                        (sequences_per_mini_batch[block], episodes_per_mini_batch[block]),
                                        trainer_version, last=update == num_updates - 1, part=part,
                                        micro_batch_rows=micro_batch_rows))
        loss.recording = False
        metrics = _mean_over_updates(updates)
        metrics.update(_logprob_gap(extra["old_log_probs"], shard) if recompute else {})
        metrics.update(logprob_time_s=prepared - start, update_time_s=time.perf_counter() - prepared,
                       peak_memory_gb=peak.read() / 2**30)
        if self._shared_prefixes is not None:
            tokens, distinct = self._shared_prefixes.take_counts()
            metrics.update(prefix_tokens=float(tokens), prefix_distinct=float(distinct))
        return RankStepResult(metrics, loss.drain())

    def export_weights(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, int]]:
        """(HF-named full weights on rank 0 / None elsewhere, summary) in the push dtype; every rank must call it."""
        weights = dict(self._tensor_by_tensor(self._push_dtype()))
        num_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        summary = {"num_tensors": len(weights), "num_bytes": num_bytes}
        return (weights if self.rank == 0 else None), summary

    def save_state(self, path: str) -> None:
        """verl's checkpoint of this rank under `path`: its model shard, optimizer, LR scheduler and RNG states."""
        self._set_up()[0].save_checkpoint(path)

    def load_state(self, path: str) -> None:
        """Load what `save_state` wrote (the same number of ranks must load it)."""
        self._set_up()[0].load_checkpoint(path)

    def save_pretrained(self, path: str) -> None:
        """Write the policy as a Hugging Face model directory at `path` (rank 0 writes; all ranks gather).

        config.json is the source model's (verl's in-memory config carries runtime overrides such
        as the attention implementation); the directory appears atomically.
        """
        weights = self._full_weights()
        if self.rank != 0:
            return
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.from_pretrained(self.spec.model_path)
        hf_config.dtype = weights[INPUT_EMBEDDING_WEIGHT].dtype
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(hf_config, dtype=hf_config.dtype)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        staging.chmod(0o755)
        skeleton.save_pretrained(staging, state_dict=weights)
        model_config = self._set_up()[0].model_config
        model_config.tokenizer.save_pretrained(staging)
        if model_config.generation_config is not None:
            model_config.generation_config.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)

    def stream_endpoint(self) -> tuple[str, int, int]:
        """Where this rank hosts a streamed push's rendezvous: its node's address and two ports free there now
        (the store's and the control socket's, `weight_stream.PushGroup`)."""
        import ray

        from fullasync.weights.stream import free_ports

        address = ray.util.get_node_ip_address()
        port, control_port = free_ports(address, 2)
        return address, port, control_port

    def weight_metadata(self) -> list[Metadata]:
        """(HF name, dtype, shape, the name of the tensor just before when it is the same one — tied embeddings)
        of each tensor `stream_weights` sends, in its order (a collective: one pass of the gather, holding one
        tensor at a time; asked once per run)."""
        metadata: list[Metadata] = []
        previous: tuple[str, torch.Tensor | None] = ("", None)
        for name, tensor in self._tensor_by_tensor(self._push_dtype()):
            same = previous[0] if tensor is previous[1] else ""
            metadata.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), same))
            previous = (name, tensor)
        return metadata

    def stream_weights(self, plan: StreamPlan) -> dict[str, str] | None:
        """A streamed push (`weights/stream.py`): every rank gathers the model tensor by tensor (a collective) and
        rank 0 broadcasts the plan's buckets to the engines' workers. Rank 0 returns the sampled tensors' digests."""
        from fullasync.weights import stream as weight_stream

        tensors = self._tensor_by_tensor(self._push_dtype())
        try:
            return weight_stream.send(plan, tensors) if self.rank == 0 else None
        finally:
            for _ in tensors:  # every rank gathers every tensor, even after rank 0's send failed
                pass

    def _full_weights(self) -> dict[str, torch.Tensor]:
        """HF-named full tensors (a collective: every rank gathers its shards); with LoRA, the adapters merged."""
        return dict(self._tensor_by_tensor())

    def _push_dtype(self) -> torch.dtype | None:
        """What pushed floating-point tensors are cast to (`TrainerConfig.push_dtype`; None: as held)."""
        name = self.spec.config.push_dtype
        return None if name == "auto" else getattr(torch, name)

    def _tensor_by_tensor(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The HF-named full tensors one at a time (a collective: each rank gathers each tensor's shards as it is
        asked for; with LoRA the adapters are merged first, over the whole model), floating-point ones cast to
        `dtype` where given (before the copy off the device: the bytes the push moves); a tied output layer is the
        embeddings' tensor, right after them."""
        policy = self._set_up()[0]
        if self.spec.config.lora.enabled:
            per_tensor: Iterable[tuple[str, torch.Tensor]] = merged_lora_weights(_fsdp_module(policy)).items()
        else:
            per_tensor, _ = policy.engine.get_per_tensor_param()
        tied = policy.model_config.hf_config.tie_word_embeddings
        for name, tensor in per_tensor:
            if tied and name == TIED_OUTPUT_WEIGHT:
                continue  # the embeddings' own tensor, sent right after them
            tensor = tensor.detach()
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            tensor = tensor.cpu()
            yield name, tensor
            if tied and name == INPUT_EMBEDDING_WEIGHT:
                yield TIED_OUTPUT_WEIGHT, tensor

    def _infer(self, worker: TrainingWorker, shard: TrainBatch, micro_batch_rows: int = 0) -> torch.Tensor:
        from fullasync.trainer.verl_setup import micro_batch_keys, response_logprobs, to_tensordict

        config = self.spec.config
        data = to_tensordict(shard, config.temperature, {}, compute_loss=False, calculate_entropy=False,
                             **micro_batch_keys(config, shard, micro_batch_rows))
        output = worker.infer_batch(data)
        group = getattr(worker.engine, "ulysses_parallel_group", None)
        if group is None:
            return response_logprobs(output, data)
        # sequence parallel: verl returns the values on the group's first rank only; every rank of the group
        # trains on them (the proximal or reference log-probs of the loss), so that rank hands them on
        values = torch.zeros(shard.responses.shape) if output is None else response_logprobs(output, data)
        torch.distributed.broadcast(values, src=torch.distributed.get_global_rank(group, 0), group=group)
        return values

    def _update(self, policy: TrainingWorker, block: TrainBatch, extra: dict[str, torch.Tensor],
                size: tuple[int, float], trainer_version: int, last: bool, part: StepPart,
                micro_batch_rows: int = 0) -> dict[str, float]:
        """verl's `TrainingWorker.train_batch` for one update (or its `part`) of a mini-batch of `size` (sequences,
        episodes over all ranks): zero the gradients, forward and backward over the micro-batches, clip and
        step, the LR scheduler after the step's last update."""
        from verl.utils import tensordict_utils as tu

        from fullasync.trainer.verl_setup import micro_batch_keys, to_tensordict

        config = self.spec.config
        sequences, episodes = size
        scales = sequence_gradient_scales(block, config.loss_agg_mode, sequences, episodes)
        if scales is not None:
            extra = {**extra, GRADIENT_SCALES: scales}
        data = to_tensordict(block, config.temperature, extra, calculate_entropy=True,
                             global_batch_size=sequences, trainer_version=trainer_version,
                             **{**_engine_keys(policy), **micro_batch_keys(config, block, micro_batch_rows)})
        engine = policy.engine
        tu.maybe_fix_3d_position_ids(data)
        started = time.perf_counter()
        loss = self._set_up()[1]
        loss.scale = part.loss_scale
        try:
            with engine.train_mode(zero_grad_on_exit=part.last):  # a first part's gradients wait for the second
                if part.first:
                    engine.optimizer_zero_grad()
                else:
                    _scale_gradients(_fsdp_module(policy), part.earlier_scale)
                output = engine.forward_backward_batch(data, loss_function=loss, forward_only=False)
                if part.last:
                    output["metrics"]["grad_norm"] = engine.optimizer_step()
        finally:
            loss.scale = 1.0
        if last and part.last:
            output["metrics"]["lr"] = engine.lr_scheduler_step()
        output.pop("model_output", None)
        micro_batches = len(output["loss"])  # verl's losses, one per forward/backward pass
        reported = policy._postprocess_output(output, global_token_num=tu.get(data, key="global_token_num"),
                                              delta_time=time.perf_counter() - started, forward_only=False,
                                              images_seqlens=None)
        metrics = _reduce_metrics(tu.get(reported, "metrics"))
        metrics["micro_batches"] = float(micro_batches)
        if "loss" in metrics:
            metrics["loss"] /= part.loss_scale  # the part's own loss; the trainer weighs the parts
        return metrics


def _engine_keys(policy: TrainingWorker) -> dict[str, object]:
    """The engine settings verl's `TrainingWorker.train_batch` puts on a batch that does not carry them."""
    engine_config = policy.engine_config
    return {
        "use_remove_padding": policy.model_config.get("use_remove_padding", False),
        "use_dynamic_bsz": engine_config.use_dynamic_bsz,
        "max_token_len_per_gpu": engine_config.max_token_len_per_gpu,
        "micro_batch_size_per_gpu": engine_config.micro_batch_size_per_gpu,
        "use_fused_kernels": engine_config.use_fused_kernels,
    }


def _chunked_head(model: torch.nn.Module) -> bool:
    """Whether the model verl built computes log-probs and entropy in chunks from the hidden states (its forward
    replaced by verl's fused torch kernel)."""
    base = getattr(getattr(model, "base_model", None), "model", model)  # under LoRA, peft's wrapped model
    return getattr(base, "_verl_fused_kernels_backend", None) == "torch"  # set by verl's patch of the forward


def _scale_gradients(module: torch.nn.Module, factor: float) -> None:
    """Multiply every accumulated gradient (this rank's shards) by `factor`."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.grad is not None:
                parameter.grad.mul_(factor)


def _fsdp_module(policy: TrainingWorker) -> torch.nn.Module:
    """The FSDP-wrapped model of verl's FSDP engine (its `module`; verl's BaseEngine does not declare it)."""
    engine: Any = policy.engine
    return engine.module


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _reduce_metrics(verl_metrics: Mapping[str, object]) -> dict[str, float]:
    """One float per metric of one verl update (verl reports per micro-batch and per rank)."""
    from verl.utils.metric import Metric

    reduced = {}
    for name, value in verl_metrics.items():
        if name not in METRIC_NAMES:
            continue
        if isinstance(value, Metric):
            scalar = value.aggregate()
        elif isinstance(value, list) and value and all(isinstance(v, Metric) for v in value):
            scalar = Metric.aggregate_dp(value)
        else:
            scalar = float(np.mean(np.asarray(value, dtype=np.float64)))
        reduced[METRIC_NAMES[name]] = float(scalar)
    return reduced


def _mean_over_updates(updates: list[dict[str, float]]) -> dict[str, float]:
    names = {name for update in updates for name in update}
    metrics = {name: float(np.mean([u[name] for u in updates if name in u])) for name in names}
    metrics["grad_norm_max"] = max(u.get("grad_norm", 0.0) for u in updates)
    metrics["num_updates"] = float(len(updates))
    return metrics


def _logprob_gap(old_logprobs: torch.Tensor, shard: TrainBatch) -> dict[str, float]:
    """Sum and max of |proximal − rollout| log-prob over sampled tokens (rollout/trainer mismatch + staleness)."""
    mask = shard.response_mask.bool()
    gap = (old_logprobs - shard.behaviour_logprobs).abs()[mask]
    return {
        "logprob_gap_sum": float(gap.sum()) if gap.numel() else 0.0,
        "logprob_gap_max": float(gap.max()) if gap.numel() else 0.0,
        "logprob_gap_tokens": float(gap.numel()),
    }
