"""What the trainer does in one step: optimiser, losses, advantages, workers.

Owns: `TrainerConfig` and its start-up validation (`TrainerConfig.validate`), which resolves the
registry names against verl. Imports no verl, torch or Ray at module level, so the config loads
anywhere (Hydra registration, CLI help).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # verl kl_penalty names; "+" suffix allowed
# Inputs build_batch hands an advantage estimator; one that needs more (gae: values) is rejected.
ESTIMATOR_INPUTS = ("token_level_rewards", "response_mask", "index", "config", "epsilon", "norm_adv_by_std_in_grpo")


@dataclass
class TrainerConfig:
    """Knobs of `VerlTrainer`; each field's comment is its help text."""

    lr: float = 1e-6  # AdamW learning rate (constant schedule)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # clip the global gradient norm to this; an update with a non-finite norm is skipped
    micro_batch_size: int = 4  # sequences per forward/backward pass on one worker (gradient accumulation unit)
    ppo_epochs: int = 1  # passes over each batch per train_step; each pass makes `mini_batches` optimizer updates
    mini_batches: int = 1  # optimizer updates per pass: the batch is split into this many mini-batches
    advantage_estimator: str = "grpo"  # outcome estimator in verl's registry: grpo, rloo, reinforce_plus_plus, ...
    norm_adv_by_std_in_grpo: bool = True  # grpo: divide by the group's reward std (False: Dr. GRPO)
    gamma: float = 1.0  # discount of token-level estimators (reinforce_plus_plus)
    policy_loss: str = "vanilla"  # loss in verl's policy-loss registry: vanilla (PPO clip), gspo, cispo, ...
    clip_ratio_low: float = 0.2  # importance ratio is clipped below at 1 - clip_ratio_low
    clip_ratio_high: float = 0.2  # importance ratio is clipped above at 1 + clip_ratio_high (0.28: DAPO clip-higher)
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages (vanilla); must be > 1
    loss_agg_mode: str = "token-mean"  # token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, ...
    entropy_coeff: float = 0.0  # entropy bonus coefficient (the entropy is reported either way)
    kl_coef: float = 0.0  # weight of the KL-to-reference loss; 0 = no reference model is loaded
    kl_type: str = "low_var_kl"  # verl kl_penalty estimator for the KL loss: k1, k2, low_var_kl (k3), abs
    temperature: float = 1.0  # sampling temperature of the rollout; the trainer divides logits by it
    recompute_old_logprobs: bool = True  # True: old log-probs recomputed by the trainer; False: rollout's
    checkpoint_dir: str = ""  # save_checkpoint() without a path writes <checkpoint_dir>/step_<n>; "" = no default
    seed: int = 0  # seeds torch in the workers and verl's engine
    model_dtype: str = "fp32"  # dtype of parameters, gradients and optimizer state (CPU supports fp32 only)
    num_workers: int = 1  # FSDP2 data-parallel worker processes (one node)
    worker_num_cpus: float = 1.0  # Ray CPUs reserved per worker
    worker_threads: int = 0  # torch threads per worker; 0 = cpu_count // num_workers (at least 1)
    start_timeout_s: float = 600.0  # seconds allowed for the workers to start and load the model
    call_timeout_s: float = 600.0  # seconds allowed for one remote call (train step, log-probs, export, save)

    def validate(self) -> None:
        """Check fields and resolve registry names against verl; the error names the field and the fix."""
        _check_positive(self, "lr", "micro_batch_size", "ppo_epochs", "mini_batches", "grad_clip", "num_workers",
                        "worker_num_cpus", "temperature", "start_timeout_s", "call_timeout_s")
        _check_non_negative(self, "weight_decay", "kl_coef", "entropy_coeff", "clip_ratio_low", "clip_ratio_high",
                            "worker_threads")
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"TrainerConfig.clip_ratio_c={self.clip_ratio_c} must be > 1 (dual-clip bound)")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"TrainerConfig.loss_agg_mode={self.loss_agg_mode!r}: choose one of {LOSS_AGG_MODES}")
        if self.kl_type.removesuffix("+") not in KL_TYPES:
            raise ValueError(f"TrainerConfig.kl_type={self.kl_type!r}: choose one of {KL_TYPES} (optionally with '+')")
        if self.model_dtype != "fp32":
            raise ValueError(f"TrainerConfig.model_dtype={self.model_dtype!r}: only 'fp32' is supported")
        _check_policy_loss(self.policy_loss)
        _check_advantage_estimator(self.advantage_estimator)


def _check_positive(config: TrainerConfig, *names: str) -> None:
    for name in names:
        if not getattr(config, name) > 0:
            raise ValueError(f"TrainerConfig.{name}={getattr(config, name)!r} must be > 0")


def _check_non_negative(config: TrainerConfig, *names: str) -> None:
    for name in names:
        if getattr(config, name) < 0:
            raise ValueError(f"TrainerConfig.{name}={getattr(config, name)!r} must be >= 0")


def _check_policy_loss(name: str) -> None:
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"TrainerConfig.policy_loss={name!r} is not in verl's policy-loss registry; "
            f"choose one of {sorted(POLICY_LOSS_REGISTRY)}"
        )


def _check_advantage_estimator(name: str) -> None:
    """The estimator must exist and need no inputs beyond outcome rewards and group ids."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"TrainerConfig.advantage_estimator={name!r} is not in verl's advantage registry; "
            f"choose one of {sorted(ADV_ESTIMATOR_REGISTRY)}"
        )
    missing = estimator_missing_inputs(ADV_ESTIMATOR_REGISTRY[name])
    if missing:
        raise ValueError(
            f"TrainerConfig.advantage_estimator={name!r} needs {missing}, which outcome-reward training does "
            f"not provide; choose an outcome estimator such as 'grpo', 'rloo' or 'reinforce_plus_plus'"
        )


def estimator_missing_inputs(estimator: object) -> list[str]:
    """Required parameters of a verl advantage estimator that `build_batch` cannot supply."""
    parameters = inspect.signature(estimator).parameters.values()
    return [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in ESTIMATOR_INPUTS
    ]
