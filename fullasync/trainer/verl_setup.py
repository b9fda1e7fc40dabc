"""TrainerConfig → verl 0.9.1 configuration objects and verl's TensorDict input format.

Owns: the translation from our config to verl's `TrainingWorkerConfig` (HFModelConfig,
FSDPEngineConfig, FSDPOptimizerConfig, CheckpointConfig) and to the `ActorConfig` that verl's
`ppo_loss` reads (wrapped by the off-policy correction of `corrections.py`), and the conversion
of a `TrainBatch` into the no-padding TensorDict that `TrainingWorker.infer_batch` / `train_batch`
take. Runs inside trainer workers, after the CPU platform patch is applied (it imports
`verl.workers`).
"""

from __future__ import annotations

import copy
import importlib.util

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

from fullasync.config import TrainerConfig
from fullasync.trainer.attention import PACKED_SDPA
from fullasync.trainer.batch import TrainBatch
from fullasync.trainer.corrections import CorrectedPolicyLoss

# FSDP mixed precision per `TrainerConfig.model_dtype`: the dtype of compute; master weights (verl's model_dtype),
# optimizer state, gradient reduction and buffers stay fp32 either way
MIXED_PRECISION = {
    "fp32": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    "bf16": {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
}


def training_worker_config(
    model_path: str, config: TrainerConfig, *, on_cpu: bool, reference: bool = False
) -> TrainingWorkerConfig:
    """Config of one verl TrainingWorker: the trained policy, or a frozen reference (never stepped).

    On CPU the reference is not marked forward-only: verl gives forward-only FSDP2 engines a
    CPUOffloadPolicy with pinned memory, which needs an accelerator. Its optimizer state is
    never allocated (AdamW creates state on the first step, which never comes).
    """
    packed = padding_free(config, on_cpu)
    model = HFModelConfig(
        path=model_path,
        override_config={"attn_implementation": attention_implementation(packed, on_cpu, config.share_prefixes)},
        use_remove_padding=packed,
        use_fused_kernels=config.chunked_logprobs,
        fused_kernel_options={"impl_backend": "torch"} if config.chunked_logprobs else {},
        enable_gradient_checkpointing=config.gradient_checkpointing,
        lora_rank=config.lora.rank,
        lora_alpha=config.lora.alpha,
        target_modules=config.lora.modules,
    )
    for name, value in config.hf_overrides.items():  # whole values, as vLLM applies its hf_overrides (verl's
        setattr(model.hf_config, name, copy.deepcopy(value))  # override_config cannot replace a nested mapping)
    engine = FSDPEngineConfig(
        strategy="fsdp2",
        model_dtype="fp32",  # master weights
        mixed_precision=MIXED_PRECISION[config.model_dtype],
        param_offload=config.param_offload and not on_cpu,  # on CPU the parameters are in host memory already
        optimizer_offload=config.optimizer_offload and not on_cpu,
        use_dynamic_bsz=config.max_tokens_per_micro_batch > 0,
        micro_batch_size_per_gpu=config.micro_batch_size,
        infer_micro_batch_size_per_gpu=config.micro_batch_size,
        max_token_len_per_gpu=config.max_tokens_per_micro_batch,  # read only by tokens (above 0)
        infer_max_token_len_per_gpu=config.max_tokens_per_micro_batch,
        use_fused_kernels=config.chunked_logprobs,
        ulysses_sequence_parallel_size=config.sequence_parallel_size,
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


def padding_free(config: TrainerConfig, on_cpu: bool) -> bool:
    """Whether micro-batches are packed without padding: `on`, `off`, or for `auto` where flash-attention serves
    the model (CUDA with flash_attn installed) or sequences are shared by several ranks (sequence parallelism
    slices the packed row). `on` elsewhere runs through `attention.PACKED_SDPA`
    (tests/integration/test_trainer_precision.py checks it against a plain forward on CPU)."""
    if config.padding_free != "auto":
        return config.padding_free == "on"
    return _has_flash_attention(on_cpu) or config.sequence_parallel_size > 1 or config.share_prefixes


def attention_implementation(packed: bool, on_cpu: bool, share_prefixes: bool = False) -> str:
    """The attention the model is built with: flash-attention for packed rows where installed, else our causal
    SDPA per packed sequence (with Ulysses when sequence parallel), which also attends over shared prefixes' trees
    (`prefix_sharing`), and transformers' SDPA for padded rows."""
    if not packed:
        return "sdpa"
    return "flash_attention_2" if _has_flash_attention(on_cpu) and not share_prefixes else PACKED_SDPA


def _has_flash_attention(on_cpu: bool) -> bool:
    return not on_cpu and importlib.util.find_spec("flash_attn") is not None


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


def micro_batch_keys(config: TrainerConfig, batch: TrainBatch, planned_rows: int = 0) -> dict[str, bool | int]:
    """How verl splits `batch` into micro-batches on a worker: by count, or by tokens with the budget raised to the
    batch's longest sequence (over the sequence-parallel group), which verl would refuse otherwise: a longer
    sequence gets a micro-batch alone; `planned_rows` > 0: the batch was planned into micro-batches of that many rows
    (prefix sharing), passed by count in its order."""
    if planned_rows:
        return {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": planned_rows}
    if not config.max_tokens_per_micro_batch:
        return {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": config.micro_batch_size}
    longest = int(batch.attention_mask.sum(dim=1).max()) if batch.num_sequences else 0
    share = -(-longest // config.sequence_parallel_size)
    return {"use_dynamic_bsz": True, "max_token_len_per_gpu": max(config.max_tokens_per_micro_batch, share)}


def to_tensordict(batch: TrainBatch, temperature: float, extra: dict[str, torch.Tensor], **meta: object) -> TensorDict:
    """verl's no-padding TensorDict for `batch`; `extra` adds per-row tensors ((N, R) per token or (N,) per
    sequence), `meta` non-tensor keys."""
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
