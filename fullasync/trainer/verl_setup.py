"""TrainerConfig → verl 0.9.1 configuration objects and verl's TensorDict input format.

Owns: the translation from our config to verl's `TrainingWorkerConfig` (HFModelConfig,
FSDPEngineConfig, FSDPOptimizerConfig, CheckpointConfig) and to the `ActorConfig` that verl's
`ppo_loss` reads (wrapped by the off-policy correction of `corrections.py`), and the conversion
of a `TrainBatch` into the no-padding TensorDict that `TrainingWorker.infer_batch` / `train_batch`
take. Runs inside trainer workers, after the CPU platform patch is applied (it imports
`verl.workers`).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from verl.trainer.config import CheckpointConfig
from verl.utils import tensordict_utils as tu
from verl.workers.config import (
    ActorConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    HFModelConfig,
    PolicyLossConfig,
    TrainingWorkerConfig,
)
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from fullasync.trainer.batch import TrainBatch
from fullasync.trainer.config import TrainerConfig
from fullasync.trainer.corrections import CorrectedPolicyLoss

FP32_MIXED_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def training_worker_config(
    model_path: str, config: TrainerConfig, *, on_cpu: bool, reference: bool = False
) -> TrainingWorkerConfig:
    """Config of one verl TrainingWorker: the trained policy, or a frozen reference (never stepped).

    On CPU the reference is not marked forward-only: verl gives forward-only FSDP2 engines a
    CPUOffloadPolicy with pinned memory, which needs an accelerator. Its optimizer state is
    never allocated (AdamW creates state on the first step, which never comes).
    """
    model = HFModelConfig(
        path=model_path,
        override_config={"attn_implementation": "sdpa"},  # no flash-attn on CPU
        use_remove_padding=False,  # padded batches + attention mask: no packed-sequence kernels needed
        enable_gradient_checkpointing=False,
    )
    engine = FSDPEngineConfig(
        strategy="fsdp2",
        model_dtype=config.model_dtype,
        mixed_precision=FP32_MIXED_PRECISION,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=config.micro_batch_size,
        infer_micro_batch_size_per_gpu=config.micro_batch_size,
        use_torch_compile=False,
        forward_only=reference and not on_cpu,
        seed=config.seed,
    )
    optimizer = FSDPOptimizerConfig(
        lr=config.lr,
        weight_decay=config.weight_decay,
        clip_grad=config.grad_clip,
        lr_scheduler_type="constant",
    )
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=model,
        engine_config=engine,
        optimizer_config=optimizer,
        checkpoint_config=CheckpointConfig(),
    )


def policy_loss_fn(config: TrainerConfig) -> CorrectedPolicyLoss:
    """verl's `ppo_loss` bound to an ActorConfig carrying our loss settings, behind the configured correction."""
    actor = ActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=config.micro_batch_size,
        ppo_epochs=config.ppo_epochs,
        clip_ratio=config.clip_ratio_low,
        clip_ratio_low=config.clip_ratio_low,
        clip_ratio_high=config.clip_ratio_high,
        clip_ratio_c=config.clip_ratio_c,
        policy_loss=PolicyLossConfig(loss_mode=config.loss_mode),
        loss_agg_mode=config.loss_agg_mode,
        entropy_coeff=config.entropy_coeff,
        calculate_entropy=True,
        use_kl_loss=config.kl_coef > 0,
        kl_loss_coef=config.kl_coef,
        kl_loss_type=config.kl_type,
        use_torch_compile=False,
    )
    return CorrectedPolicyLoss(config, actor)


def to_tensordict(batch: TrainBatch, temperature: float, extra: dict[str, torch.Tensor], **meta: Any) -> TensorDict:
    """verl's no-padding TensorDict for `batch`; `extra` adds (N, R) per-token tensors, `meta` non-tensor keys."""
    tensors: dict[str, torch.Tensor | list] = {  # the type verl's get_tensordict takes
        "prompts": batch.prompts,
        "responses": batch.responses,
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
        "response_mask": batch.response_mask,
        "advantages": batch.advantages,
        "rollout_log_probs": batch.behaviour_logprobs,
        "versions": batch.versions,
        **extra,
    }
    data = tu.get_tensordict(tensor_dict=tensors, non_tensor_dict={"temperature": temperature, **meta})
    return left_right_2_no_padding(data)


def response_logprobs(output: TensorDict, data: TensorDict) -> torch.Tensor:
    """(N, R) log-probs of each response token from an `infer_batch` output (0 past the response)."""
    return no_padding_2_padding(tu.get(output, "log_probs"), data).float()
