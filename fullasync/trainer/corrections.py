"""Version-aware off-policy corrections of the policy loss, and their per-step statistics.

Owns: turning what the rollout recorded per token (behaviour log-probs, the weight version that
sampled each token) plus the trainer's version into the two inputs verl's `ppo_loss` takes for an
off-policy batch — the log-probs the PPO ratio is clipped against (`old_log_probs`) and a per-token
weight (`rollout_is_weights`) — and the mismatch statistics of each step. Does not own: the PPO
objective (verl's policy-loss registry, called through `ppo_loss`), the importance-weight
truncation and masking (verl's `rollout_corr_helper.compute_rollout_correction_weights`), the KL
estimators (verl's `core_algos.kl_penalty`), or recomputing log-probs (the worker).

Notation, for sampled token t of sequence i (mask 1):

    b_t = log π_behaviour(y_t)     the rollout's log-prob (`TrainBatch.behaviour_logprobs`)
    θ_t = log π_θ(y_t)             the policy being updated; the gradient flows through it
    T                              the weight version the trainer holds at this step
    g_t = T − v_t                  version gap; v_t is the version that sampled token t
    p_t = log π_prox(y_t)          proximal policy: the version-T weights
    r_t = exp(p_t − b_t)           proximal / behaviour ratio;  ρ_i = Π_t r_t = exp(Σ_t (p_t − b_t))
    PPO_t(old)                     verl's clipped term with s_t = exp(θ_t − old_t):
                                   max(−A_t s_t, −A_t clip(s_t, 1 − ε_low, 1 + ε_high)), dual-clipped by c

The loss is `agg_t( w_t · PPO_t(old) )` (agg = `loss_agg_mode`), with per correction:

    none         old = b   w = 1                          plain PPO on behaviour log-probs
    token_tis    old = p   w_t = min(r_t, C)              C = is_threshold
    seq_tis      old = p   w_t = min(ρ_i, C)
    token_mask   old = p   w_t = r_t · 1[lo ≤ r_t ≤ hi]   IcePop; lo, hi = mask_low, mask_high
    seq_mask     old = p   w_t = ρ_i · 1[lo ≤ ρ_i ≤ hi]   masked IS over the whole sequence
    decoupled    old = p   w_t = r_t · 1[r_t ≤ hi]        AReaL's decoupled PPO with its weight cap
    token_rs     old = b   w_t = 1[lo ≤ r_t ≤ hi]         PPO against the behaviour policy (the ratio
                                                         θ/b is the importance weight), tokens whose
                                                         proximal policy has drifted out of range
                                                         dropped: verl's bypass mode with token-level
                                                         rejection sampling, drift measured per token
    gspo         old = b   verl gspo: ratio s_i = exp(mean_t(θ_t − b_t)) per sequence, clipped
    cispo        old = b   verl cispo: −sg(clip(exp(θ_t − b_t))) · A_t · θ_t

A zeroed weight keeps its token in the loss denominator (as verl's IcePop does). The proximal
log-probs p come from `TrainerConfig.proximal`:

    recompute    p_t = the trainer's forward pass of the version-T weights before the update
    loglinear    p_t = b_t + α_t · (sg(θ_t) − b_t),   α_t = g_t / (g_t + 1)

loglinear is AReaL's interpolation α = (v_prox − v_b) / (v_θ − v_b) with v_prox = T (the weights
this step starts from) and v_θ = T + 1 (the version this step produces); it needs no forward pass,
only the per-token versions. At version gap 0 it gives p = b, so r = 1 and every correction above
except gspo / cispo is PPO on the behaviour log-probs: on-policy PPO exactly. With recompute, r_t
at gap 0 is 1 up to the engine/trainer numerical mismatch, which the weight then corrects.

Statistics (`CorrectionStats`, summed over micro-batches and ranks, then turned into means):
behaviour-vs-current mismatch KL(π_b ‖ π_θ) by verl's k1 (b − θ) and k3 (e^{θ−b} − (θ − b) − 1)
estimators, overall and per version gap; the fraction of tokens per gap; the mean and max weight;
the fraction of tokens whose weight was truncated (clipped) or zeroed (masked).

The loss also applies the per-sequence gradient scales of the seq-mean modes (`GRADIENT_SCALES`, set by
`batch.sequence_gradient_scales` for episodes of several lineages): the model's outputs that verl's loss reads
(log-probs, entropy) keep their values and carry their sequence's multiplier back to the model, so every term
of that sequence (policy loss, entropy bonus, KL) is weighted, whatever the policy loss.

verl is imported on first use: the driver merges `CorrectionStats` without importing
`verl.workers` (which must come after the CPU platform patch in a training process).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch

from fullasync.config.trainer import Correction, ProximalSource, TrainerConfig

if TYPE_CHECKING:  # verl is imported on first use (module docstring)
    from tensordict import TensorDict
    from torch.autograd.function import BackwardCFunction
    from torch.distributed import ProcessGroup
    from verl.workers.config import ActorConfig

TOKEN_LEVEL = frozenset({Correction.TOKEN_TIS, Correction.TOKEN_MASK, Correction.DECOUPLED, Correction.TOKEN_RS})
SEQUENCE_LEVEL = frozenset({Correction.SEQ_TIS, Correction.SEQ_MASK})
# Lower bound handed to verl's IcePop for `decoupled` (an upper cap only): below any weight
# exp(-LOG_RATIO_BOUND) that verl's clamped log-ratio can produce, so nothing is zeroed from below.
NO_LOWER_BOUND = 1e-30
LOG_RATIO_BOUND = 20.0  # verl rollout_corr_helper.SAFETY_BOUND: log-ratios are clamped to ±20 before exp
GRADIENT_SCALES = "sequence_gradient_scales"  # (rows,) key of a training batch: each sequence's gradient multiplier
SCALED_OUTPUTS = ("log_probs", "entropy")  # the model outputs verl's ppo_loss reads


@dataclass
class CorrectionStats:
    """Sums over sampled tokens, mergeable across micro-batches and ranks; `metrics()` makes means."""

    tokens: Counter[int] = field(default_factory=Counter)  # version gap → sampled tokens
    k1: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))  # version gap → Σ (b − θ)
    # version gap → Σ (e^{θ−b} − (θ − b) − 1)
    k3: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))
    weighted_tokens: int = 0  # sampled tokens that carried an importance weight
    weight_sum: float = 0.0
    weight_max: float = 0.0
    clipped: int = 0  # weights truncated below their raw value
    masked: int = 0  # weights set to zero

    def merge(self, other: CorrectionStats) -> None:
        self.tokens.update(other.tokens)
        _add(self.k1, other.k1)
        _add(self.k3, other.k3)
        self.weighted_tokens += other.weighted_tokens
        self.weight_sum += other.weight_sum
        self.weight_max = max(self.weight_max, other.weight_max)
        self.clipped += other.clipped
        self.masked += other.masked

    def metrics(self, prefix: str = "correction/") -> dict[str, float]:
        """Means over sampled tokens; per-gap keys end in `/gap_<g>`. Empty when no token was seen."""
        total = sum(self.tokens.values())
        if total == 0:
            return {}
        metrics = {
            f"{prefix}kl_k1": sum(self.k1.values()) / total,
            f"{prefix}kl_k3": sum(self.k3.values()) / total,
        }
        for gap in sorted(self.tokens):
            count = self.tokens[gap]
            metrics[f"{prefix}tokens_frac/gap_{gap}"] = count / total
            metrics[f"{prefix}kl_k1/gap_{gap}"] = self.k1[gap] / count
            metrics[f"{prefix}kl_k3/gap_{gap}"] = self.k3[gap] / count
        if self.weighted_tokens:
            metrics.update({
                f"{prefix}is_weight_mean": self.weight_sum / self.weighted_tokens,
                f"{prefix}is_weight_max": self.weight_max,
                f"{prefix}clipped_frac": self.clipped / self.weighted_tokens,
                f"{prefix}masked_frac": self.masked / self.weighted_tokens,
            })
        return metrics


def _add(sums: defaultdict[int, float], other: Mapping[int, float]) -> None:
    for gap, value in other.items():
        sums[gap] += value


@dataclass(frozen=True)
class CorrectedInputs:
    """What the correction hands verl's `ppo_loss`, aligned to the responses: (N, R) each."""

    old_log_probs: torch.Tensor  # the PPO ratio's denominator (detached)
    weights: torch.Tensor | None  # rollout_is_weights (detached), None for corrections without one
    stats: CorrectionStats


def version_gaps(versions: torch.Tensor, response_mask: torch.Tensor, trainer_version: int) -> torch.Tensor:
    """T − v on sampled tokens, 0 elsewhere. Raises ValueError if a token is newer than the trainer."""
    mask = response_mask.bool()
    gaps = torch.where(mask, trainer_version - versions, torch.zeros_like(versions))
    if bool((gaps < 0).any()):
        newest = int(versions[mask].max())
        raise ValueError(f"a token was sampled by version {newest}, newer than the trainer's version "
                         f"{trainer_version}: pass the version the trainer holds to train_step")
    return gaps


def loglinear_proximal(behaviour: torch.Tensor, current: torch.Tensor, gaps: torch.Tensor) -> torch.Tensor:
    """AReaL's log-linear proximal log-probs: b + g/(g+1) · (θ − b), with θ detached (see module doc)."""
    alpha = gaps.to(behaviour.dtype) / (gaps.to(behaviour.dtype) + 1.0)
    return behaviour + alpha * (current.detach() - behaviour)


def importance_weights(
    correction: Correction, log_ratio: torch.Tensor, response_mask: torch.Tensor, config: TrainerConfig
) -> torch.Tensor:
    """w of `correction` from log r = p − b, by verl's `compute_rollout_correction_weights` (TIS / IcePop)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    mask = response_mask.to(log_ratio.dtype)
    level = "token" if correction in TOKEN_LEVEL else "sequence"
    if correction in (Correction.TOKEN_TIS, Correction.SEQ_TIS):
        threshold: float | str = config.is_threshold
        kept = mask.bool()
    else:
        low = NO_LOWER_BOUND if correction is Correction.DECOUPLED else config.mask_low
        threshold = f"{low}_{config.mask_high}"
        raw = _raw_weights(correction, log_ratio, mask.bool())
        kept = mask.bool() & (raw >= low) & (raw <= config.mask_high)
    if not bool(kept.any()):
        # nothing to weight, or every weight zeroed: verl's weight statistics would divide by zero
        return torch.zeros_like(log_ratio)
    weights, _ = compute_rollout_correction_weights(log_ratio.detach(), mask, rollout_is=level,
                                                    rollout_is_threshold=threshold)
    return weights


def correct(
    config: TrainerConfig,
    *,
    current: torch.Tensor,
    behaviour: torch.Tensor,
    versions: torch.Tensor,
    response_mask: torch.Tensor,
    trainer_version: int,
    recomputed: torch.Tensor | None = None,
) -> CorrectedInputs:
    """`old_log_probs` and weights of `config`'s correction for one (micro-)batch, and its statistics.

    `current` are the log-probs of the policy being updated (detached here); `recomputed` the
    proximal log-probs of the forward pass before the update (needed when `config.proximal` is
    recompute and the correction uses a proximal policy). All tensors (N, R), aligned.
    """
    correction = config.resolved_correction
    mask = response_mask.bool()
    current = current.detach()
    gaps = version_gaps(versions, response_mask, trainer_version)
    stats = _mismatch_stats(behaviour, current, gaps, mask)
    if correction not in TOKEN_LEVEL | SEQUENCE_LEVEL:
        return CorrectedInputs(behaviour, None, stats)
    if config.proximal == ProximalSource.LOGLINEAR.value:
        proximal = loglinear_proximal(behaviour, current, gaps)
    elif recomputed is None:
        raise ValueError(f"correction={correction.value} with proximal=recompute needs the recomputed log-probs")
    else:
        proximal = recomputed
    proximal = torch.where(mask, proximal, behaviour).detach()
    log_ratio = (proximal - behaviour) * mask
    if correction is Correction.TOKEN_RS:
        keep = rejection_mask(log_ratio, response_mask, config)
        _add_weight_stats(stats, keep, mask.to(keep.dtype), mask)  # a kept token's weight is 1: never clipped
        return CorrectedInputs(behaviour, keep, stats)
    weights = importance_weights(correction, log_ratio, response_mask, config)
    _add_weight_stats(stats, weights, _raw_weights(correction, log_ratio, mask), mask)
    return CorrectedInputs(proximal, weights, stats)


def rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, config: TrainerConfig) -> torch.Tensor:
    """1 where mask_low ≤ r_t ≤ mask_high, else 0, by verl's `compute_rollout_rejection_mask` (token_k1).

    verl's token_k1 statistic is −log r, so its bounds are the reciprocals of the ratio bounds.
    """
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    mask = response_mask.to(log_ratio.dtype)
    if not bool(mask.any()):  # verl rejects a micro-batch without sampled tokens
        return torch.zeros_like(log_ratio)
    kept, _ = compute_rollout_rejection_mask(log_ratio.detach(), mask, rollout_rs="token_k1",
                                             rollout_rs_threshold=f"{1.0 / config.mask_high}_{1.0 / config.mask_low}")
    return kept.to(log_ratio.dtype)


def _raw_weights(correction: Correction, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """r_t or ρ_i before truncation or masking, clamped as verl clamps it."""
    if correction in TOKEN_LEVEL:
        return torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)) * mask
    per_sequence = (log_ratio * mask).sum(dim=-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.exp(per_sequence).expand_as(log_ratio) * mask


def _mismatch_stats(
    behaviour: torch.Tensor, current: torch.Tensor, gaps: torch.Tensor, mask: torch.Tensor
) -> CorrectionStats:
    from verl.trainer.ppo.core_algos import kl_penalty

    # verl annotates kl_penalty's inputs as torch.FloatTensor, a legacy class no Tensor matches statically
    k1 = kl_penalty(behaviour, current, "k1")  # type: ignore[arg-type]  # b − θ
    k3 = kl_penalty(behaviour, current, "k3")  # type: ignore[arg-type]  # e^{θ−b} − (θ − b) − 1 (verl clamps to ±10)
    stats = CorrectionStats()
    sampled_gaps = gaps[mask]
    for gap in sampled_gaps.unique().tolist():
        where = mask & (gaps == gap)
        stats.tokens[int(gap)] += int(where.sum())
        stats.k1[int(gap)] += float(k1[where].double().sum())
        stats.k3[int(gap)] += float(k3[where].double().sum())
    return stats


def _add_weight_stats(stats: CorrectionStats, weights: torch.Tensor, raw: torch.Tensor, mask: torch.Tensor) -> None:
    applied, untouched = weights[mask], raw[mask]
    stats.weighted_tokens += int(applied.numel())
    if applied.numel() == 0:
        return
    stats.weight_sum += float(applied.double().sum())
    stats.weight_max = max(stats.weight_max, float(applied.max()))
    stats.masked += int((applied == 0).sum())
    stats.clipped += int(((applied > 0) & (applied < untouched)).sum())


class CorrectedPolicyLoss:
    """verl's `ppo_loss` with `old_log_probs` and `rollout_is_weights` set by the configured correction.

    Called by verl's TrainingWorker once per micro-batch, as `loss(model_output=..., data=...)`.
    `data` carries `rollout_log_probs` and `versions` (the rollout's), `old_log_probs` (the
    recomputed proximal log-probs, or the behaviour ones when nothing is recomputed), and the
    non-tensor `trainer_version`; without it the newest sampled version of the micro-batch is
    taken (exact on-policy; an underestimate of every gap otherwise), and where the batch carries
    `GRADIENT_SCALES`, each sequence's gradient multiplier (module doc). While `recording` is set,
    statistics accumulate in `stats` until `drain()`. The loss is multiplied by `scale`.
    """

    def __init__(self, config: TrainerConfig, actor_config: ActorConfig) -> None:
        from verl.workers.utils.losses import ppo_loss

        self.config = config
        self._ppo_loss = partial(ppo_loss, config=actor_config)
        self.recording = False
        self.stats = CorrectionStats()
        self.scale = 1.0  # the loss is multiplied by this (a step in parts, `worker.StepPart.loss_scale`)

    def __call__(self, model_output: dict[str, torch.Tensor], data: TensorDict,
                 dp_group: ProcessGroup | None = None) -> tuple[torch.Tensor, dict]:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        log_prob = no_padding_2_padding(model_output["log_probs"], data)
        fields = data.select("response_mask", "rollout_log_probs", "versions", "old_log_probs").to_padded_tensor()
        response_mask = fields["response_mask"]
        versions = fields["versions"]
        trainer_version = tu.get_non_tensor_data(data=data, key="trainer_version", default=None)
        if trainer_version is None:
            sampled = versions[response_mask.bool()]
            trainer_version = int(sampled.max()) if sampled.numel() else 0
        corrected = correct(
            self.config, current=log_prob, behaviour=fields["rollout_log_probs"].to(log_prob.dtype),
            versions=versions, response_mask=response_mask, trainer_version=int(trainer_version),
            recomputed=fields["old_log_probs"].to(log_prob.dtype) if self.config.recomputes_proximal else None,
        )
        if self.recording:
            self.stats.merge(corrected.stats)
        patched = data.clone(recurse=False)
        patched["old_log_probs"] = corrected.old_log_probs
        if corrected.weights is not None:
            patched["rollout_is_weights"] = corrected.weights
        if GRADIENT_SCALES in data:
            model_output = scaled_gradients(model_output, data[GRADIENT_SCALES])
        loss, metrics = self._ppo_loss(model_output=model_output, data=patched, dp_group=dp_group)
        return (loss * self.scale if self.scale != 1.0 else loss), metrics

    def drain(self) -> CorrectionStats:
        """The statistics recorded since the last drain (and a fresh accumulator)."""
        stats, self.stats = self.stats, CorrectionStats()
        return stats


def scaled_gradients(model_output: Mapping[str, torch.Tensor], scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """`model_output` with its `SCALED_OUTPUTS` (nested, one row per sequence) unchanged in value and the
    gradient through row i multiplied by `scales[i]`."""
    scaled = dict(model_output)
    for name in SCALED_OUTPUTS:
        output = model_output.get(name)
        if output is None:
            continue
        offsets = output.offsets()  # type: ignore[attr-defined]  # a jagged nested tensor's (not in torch's stubs)
        per_token = scales.to(output.device, output.dtype).repeat_interleave(offsets.diff())
        values = _ScaleGradient.apply(output.values(), per_token)
        scaled[name] = torch.nested.nested_tensor_from_jagged(values, offsets)
    return scaled


class _ScaleGradient(torch.autograd.Function):
    """The identity forward; backward multiplies the incoming gradient by `scale` (aligned to `values`)."""

    @staticmethod
    def forward(ctx: BackwardCFunction, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(scale)
        return values.view_as(values)

    @staticmethod
    def backward(ctx: BackwardCFunction, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (scale,) = ctx.saved_tensors
        return grad * scale, None
