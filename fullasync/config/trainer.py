"""What the trainer does in one step: optimiser, losses, advantages, workers.

Owns: `TrainerConfig` and its start-up validation (`TrainerConfig.validate`), which resolves the
registry names against verl, and the names of the off-policy corrections (`Correction`,
`ProximalSource`) with the rule that picks one when none is chosen (`default_correction`). The
formulas live in `corrections.py`. Imports no verl, torch or Ray at module level, so the config
loads anywhere (Hydra registration, CLI help).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from fullasync.config.checks import check_ray_resources, parse_cpus
from fullasync.config.fields import section, setting

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
GROUP_LOCAL_ESTIMATORS = ("grpo", "rloo", "grpo_passk")  # advantages from the group alone: a batch may come in parts
MODEL_DTYPES = ("fp32", "bf16")
PUSH_DTYPES = ("auto", "float32", "bfloat16", "float16")  # torch's names; auto: as the trainer holds them
PADDING_FREE = ("auto", "on", "off")
WEIGHT_TRANSPORTS = ("object_store", "stream")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # verl kl_penalty names; "+" suffix allowed
# Inputs build_batch hands an advantage estimator; one that needs more (gae: values) is rejected.
ESTIMATOR_INPUTS = ("token_level_rewards", "response_mask", "index", "config", "epsilon", "norm_adv_by_std_in_grpo")


class Correction(str, enum.Enum):
    """Off-policy corrections of the policy loss; formulas in `fullasync.trainer.corrections`."""

    AUTO = "auto"  # DEFAULT_CORRECTION when the data may be stale (staleness > 0), NONE when it is on-policy
    NONE = "none"  # PPO clipped against the behaviour log-probs, no weights (the baseline)
    TOKEN_TIS = "token_tis"  # PPO against the proximal policy × per-token truncated IS weight (TIS)
    SEQ_TIS = "seq_tis"  # PPO against the proximal policy × per-sequence truncated IS weight
    TOKEN_MASK = "token_mask"  # PPO against the proximal policy × per-token IS weight, zeroed out of range (IcePop)
    SEQ_MASK = "seq_mask"  # PPO against the proximal policy × per-sequence IS weight, zeroed out of range (MIS)
    DECOUPLED = "decoupled"  # AReaL decoupled PPO: proximal clip × proximal/behaviour weight, capped
    TOKEN_RS = "token_rs"  # PPO against the behaviour policy; tokens with proximal/behaviour out of range dropped
    GSPO = "gspo"  # sequence-level (length-normalised) ratio clipped against the behaviour policy
    CISPO = "cispo"  # clipped, stop-gradient IS weight × log-prob, against the behaviour policy


class ProximalSource(str, enum.Enum):
    """Where the proximal policy's log-probs come from, for corrections that use one."""

    LOGLINEAR = "loglinear"  # AReaL's interpolation between behaviour and current log-probs by version gap
    RECOMPUTE = "recompute"  # a forward pass of the trainer's weights before the update (exact)


# What `auto` applies to possibly stale data: plain PPO clipped against the behaviour policy. With it fully async
# learned as much as sync on both studied tasks: deepresearch (docs/learning_parity.md: k = 4, where gspo fell
# 0.11 F1 behind sync) and arithmetic (docs/staleness_study.md: k = 1, 4, 8,
# where gspo was ahead of sync at k <= 4 and one seed in three collapsed at k = 8; the token-level corrections —
# decoupled, TIS, IcePop masks, token_rs — fell behind).
DEFAULT_CORRECTION = Correction.NONE
PROXIMAL_CORRECTIONS = frozenset(
    {Correction.TOKEN_TIS, Correction.SEQ_TIS, Correction.TOKEN_MASK, Correction.SEQ_MASK, Correction.DECOUPLED,
     Correction.TOKEN_RS}
)
LOSS_CORRECTIONS = frozenset({Correction.GSPO, Correction.CISPO})  # corrections that are a verl policy loss


def default_correction(correction: str, staleness: int | None, policy_loss: str = "vanilla") -> Correction:
    """The correction a run uses: the chosen one, or for `auto` DEFAULT_CORRECTION unless staleness is 0.

    `staleness` None means unknown (a trainer used on its own): then `auto` is DEFAULT_CORRECTION.
    A chosen `policy_loss` other than vanilla is kept: `auto` then adds no correction (NONE), since
    the default correction is itself a policy loss.
    """
    chosen = Correction(correction)
    if chosen is not Correction.AUTO:
        return chosen
    if staleness == 0 or policy_loss != "vanilla":
        return Correction.NONE
    return DEFAULT_CORRECTION


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA, through verl and peft) instead of training every weight."""

    rank: int = setting(0, "adapter rank; 0 = full fine-tuning")
    alpha: int = setting(16, "adapter scale numerator: the update is alpha / rank × B·A")
    target_modules: str = setting("all-linear", "which layers get adapters: all-linear, or comma-separated module "
                                  "names (q_proj,v_proj)")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def modules(self) -> str | list[str]:
        """`target_modules` as peft takes it."""
        if self.target_modules == "all-linear":
            return self.target_modules
        return [name.strip() for name in self.target_modules.split(",") if name.strip()]

    def validate(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"trainer.lora.rank={self.rank!r} must be an integer >= 0 (0 = no adapters)")
        if self.enabled and not self.alpha > 0:
            raise ValueError(f"trainer.lora.alpha={self.alpha!r} must be > 0")
        if self.enabled and not self.modules:
            raise ValueError(f"trainer.lora.target_modules={self.target_modules!r} names no module; use all-linear or "
                             "names such as q_proj,v_proj")


@dataclass
class TrainerConfig:
    """Knobs of `VerlTrainer`, each with its one-line help (`fullasync.config.fields.setting`)."""

    lr: float = setting(1e-6, "AdamW learning rate (constant schedule)")
    weight_decay: float = setting(0.0, "AdamW weight decay")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this; an update with a non-finite norm is "
                               "skipped")
    micro_batch_size: int = setting(4, "sequences per forward/backward pass on one worker (gradient accumulation "
                                    "unit)")
    max_tokens_per_micro_batch: int = setting(0, "micro-batches by tokens: each worker packs sequences into "
                                              "forward/backward passes of at most this many tokens (verl's dynamic "
                                              "batch size; a longer sequence gets a pass alone); 0 = by count "
                                              "(micro_batch_size sequences)")
    chunked_logprobs: bool = setting(False, "log-probs and entropy from the last hidden states 512 positions at a "
                                     "time, in the forward and the backward pass (verl's fused torch kernel): the "
                                     "[tokens, vocab] logits of a whole sequence are never held")
    share_prefixes: bool = setting(False, "compute each prefix that several sequences of a micro-batch start with "
                                   "(a group's prompt, an agent's system prompt and tools, a lineage's early "
                                   "turns; 32 tokens at least) once, forward and backward, every continuation "
                                   "attending to it: the same log-probs, loss and gradients, less work; packs "
                                   "micro-batches (needs padding_free on or auto) and attends with fullasync's "
                                   "packed SDPA, not flash-attention")
    sequence_parallel_size: int = setting(1, "ranks that share each sequence (Ulysses: the attention heads split "
                                          "across them, every other layer on a slice of the tokens); must divide "
                                          "num_workers")
    hf_overrides: dict[str, Any] = setting({}, "overrides of the model's config.json the trainer builds it with "
                                           "(rope scaling for long contexts: rope_parameters={...}); a run gives "
                                           "the trainer the engines' engine.vllm.hf_overrides, so both compute "
                                           "the same model")
    ppo_epochs: int = setting(1, "passes over each batch per train_step; each pass makes `mini_batches` optimizer "
                              "updates")
    mini_batches: int = setting(1, "optimizer updates per pass: the batch is split into this many mini-batches")
    advantage_estimator: str = setting("grpo", "outcome estimator in verl's registry: grpo, rloo, reinforce_plus_plus, "
                                       "...")
    norm_adv_by_std_in_grpo: bool = setting(True, "grpo: divide by the group's reward std (False: Dr. GRPO)")
    gamma: float = setting(1.0, "discount of token-level estimators (reinforce_plus_plus)")
    distill_kl_weight: float = setting(1.0, "on-policy distillation (a beside model of role teacher): weight of "
                                       "log p_teacher − log p_behaviour, the negated per-token reverse KL, in each "
                                       "sampled token's advantage")
    distill_task_weight: float = setting(1.0, "on-policy distillation: weight of the task reward's advantage beside "
                                         "it (0 = distillation alone)")
    policy_loss: str = setting("vanilla", "loss in verl's policy-loss registry: vanilla (PPO clip), gspo, cispo, ...")
    clip_ratio_low: float = setting(0.2, "importance ratio is clipped below at 1 - clip_ratio_low")
    clip_ratio_high: float = setting(0.2, "importance ratio is clipped above at 1 + clip_ratio_high (0.28: DAPO "
                                     "clip-higher)")
    clip_ratio_c: float = setting(3.0, "dual-clip bound for negative advantages (vanilla); must be > 1")
    loss_agg_mode: str = setting("token-mean", "token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, ...")
    entropy_coeff: float = setting(0.0, "entropy bonus coefficient (the entropy is reported either way)")
    kl_coef: float = setting(0.0, "weight of the KL-to-reference loss; 0 = no reference model is loaded")
    kl_type: str = setting("low_var_kl", "verl kl_penalty estimator for the KL loss: k1, k2, low_var_kl (k3), abs")
    temperature: float = setting(1.0, "sampling temperature of the rollout; the trainer divides logits by it")
    correction: str = setting("auto", "auto: by staleness; else none, {token,seq}_{tis,mask}, decoupled, token_rs, "
                              "gspo, cispo")
    proximal: str = setting("loglinear", "proximal log-probs: loglinear (by version gap, no forward pass) | recompute")
    is_threshold: float = setting(2.0, "token_tis / seq_tis: importance weights are truncated at this value")
    mask_low: float = setting(0.5, "token_mask / seq_mask / token_rs: importance weights below this are zeroed "
                              "(dropped)")
    mask_high: float = setting(5.0, "token_mask / seq_mask / decoupled / token_rs: weights above this are zeroed "
                               "(dropped)")
    checkpoint_dir: str = setting("", "save_checkpoint() without a path writes <checkpoint_dir>/step_<n>; \"\" = no "
                                  "default", resume_may_change=True)
    seed: int = setting(0, "seeds torch in the workers and verl's engine")
    model_dtype: str = setting("fp32", "precision of forward and backward: fp32, or bf16 (mixed precision: bf16 "
                               "compute, fp32 master weights, optimizer state and gradient reduction)")
    gradient_checkpointing: bool = setting(False, "recompute each layer's activations in the backward pass (less "
                                           "memory, ~1/3 more compute)")
    padding_free: str = setting("auto", "pack micro-batches without padding: on, off, auto (on where "
                                "flash-attention serves the model: CUDA with flash_attn installed)")
    param_offload: bool = setting(False, "keep parameters (and gradients) in host memory between uses (GPU; no-op "
                                  "on CPU)")
    optimizer_offload: bool = setting(False, "keep optimizer state in host memory between steps (GPU; no-op on CPU)")
    lora: LoraConfig = section(LoraConfig, "low-rank adapters instead of full fine-tuning (pushed to the engines "
                               "merged into the weights)")
    weight_transport: str = setting("object_store", "how a push reaches the engines: object_store (rank 0 gathers "
                                    "the model into Ray's object store; each engine's node copies it into shared "
                                    "memory) or stream (the ranks gather tensor by tensor and rank 0 broadcasts "
                                    "buckets to every engine worker over gloo: no whole model held anywhere, "
                                    "across nodes)", resume_may_change=True)
    push_dtype: str = setting("auto", "the dtype pushed weights travel in, cast on the ranks before the wire: a run "
                              "sets the engines' (engine.dtype; bf16 engines: half the bytes of fp32 masters); auto "
                              "= as the trainer holds them; or float32, bfloat16, float16", resume_may_change=True)
    num_workers: int = setting(1, "FSDP2 data-parallel worker processes (one node)")
    worker_num_cpus: float = setting(1.0, "Ray CPUs reserved per worker", resume_may_change=True)
    worker_threads: int = setting(0, "torch threads per worker; 0 = its cores: cpu_count // num_workers, or its "
                                  "share of `cpus` (at least 1)", resume_may_change=True)
    cpus: str = setting("", "CPU cores the trainer's ranks run on, as a Linux CPU list (0, 1-3): each rank's "
                        "process bound to an equal contiguous share; \"\" = every core (see engine.cpus)",
                        resume_may_change=True)
    ray_resources: dict[str, float] = setting({}, "custom Ray resources per rank: pins the ranks' node",
                                              resume_may_change=True)
    start_timeout_s: float = setting(600.0, "seconds allowed for the workers to start and load the model",
                                     resume_may_change=True)
    call_timeout_s: float = setting(600.0, "seconds allowed for one remote call (train step, log-probs, export, "
                                    "save)", resume_may_change=True)
    restart_on_failure: int = setting(3, "restarts allowed when a trainer rank dies: the trainer starts again from "
                                      "the newest complete checkpoint and trains again the steps since (engines "
                                      "keep serving); 0 = the run stops", resume_may_change=True)

    def validate(self) -> None:
        """Check fields and resolve registry names against verl; the error names the field and the fix."""
        _check_positive(self, "lr", "micro_batch_size", "ppo_epochs", "mini_batches", "grad_clip", "num_workers",
                        "worker_num_cpus", "temperature", "start_timeout_s", "call_timeout_s")
        _check_non_negative(self, "weight_decay", "kl_coef", "entropy_coeff", "clip_ratio_low", "clip_ratio_high",
                            "worker_threads", "max_tokens_per_micro_batch", "distill_kl_weight",
                            "distill_task_weight")
        self._check_sequence_parallel()
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"TrainerConfig.clip_ratio_c={self.clip_ratio_c} must be > 1 (dual-clip bound)")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"TrainerConfig.loss_agg_mode={self.loss_agg_mode!r}: choose one of {LOSS_AGG_MODES}")
        if self.kl_type.removesuffix("+") not in KL_TYPES:
            raise ValueError(f"TrainerConfig.kl_type={self.kl_type!r}: choose one of {KL_TYPES} (optionally with '+')")
        if self.model_dtype not in MODEL_DTYPES:
            raise ValueError(f"TrainerConfig.model_dtype={self.model_dtype!r}: choose one of {MODEL_DTYPES} "
                             "(bf16 keeps fp32 master weights)")
        if self.push_dtype not in PUSH_DTYPES:
            raise ValueError(f"TrainerConfig.push_dtype={self.push_dtype!r}: choose one of {PUSH_DTYPES}")
        if self.padding_free not in PADDING_FREE:
            raise ValueError(f"TrainerConfig.padding_free={self.padding_free!r}: choose one of {PADDING_FREE}")
        if self.share_prefixes and self.padding_free == "off":
            raise ValueError("TrainerConfig.share_prefixes=true shares prefixes within packed micro-batches: it needs "
                             "padding_free=on or auto, not off")
        if self.weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(f"TrainerConfig.weight_transport={self.weight_transport!r}: choose one of "
                             f"{WEIGHT_TRANSPORTS}")
        check_ray_resources("TrainerConfig.ray_resources", self.ray_resources)
        cpus = parse_cpus("trainer.cpus", self.cpus)
        if cpus and len(cpus) < self.num_workers:
            raise ValueError(f"trainer.cpus={self.cpus!r} names {len(cpus)} cores for {self.num_workers} ranks: each "
                             "rank needs one at least")
        self.lora.validate()
        _check_registered("policy_loss", self.policy_loss, "POLICY_LOSS_REGISTRY", "policy-loss")
        _check_advantage_estimator(self.advantage_estimator)
        self._check_correction()

    @property
    def resolved_correction(self) -> Correction:
        """The correction this trainer applies (`auto` with unknown staleness: DEFAULT_CORRECTION)."""
        return default_correction(self.correction, None, self.policy_loss)

    @property
    def loss_mode(self) -> str:
        """verl policy-loss name the update uses: the correction's own loss for gspo / cispo."""
        correction = self.resolved_correction
        return correction.value if correction in LOSS_CORRECTIONS else self.policy_loss

    @property
    def recomputes_proximal(self) -> bool:
        """Whether a step starts with a forward pass for the proximal log-probs."""
        return self.resolved_correction in PROXIMAL_CORRECTIONS and self.proximal == ProximalSource.RECOMPUTE.value

    @property
    def uses_version_gaps(self) -> bool:
        """Whether the loss depends on the per-token version gaps (the loglinear proximal does)."""
        return self.resolved_correction in PROXIMAL_CORRECTIONS and self.proximal == ProximalSource.LOGLINEAR.value

    def for_staleness(self, staleness: int) -> TrainerConfig:
        """A copy with `auto` resolved for data at most `staleness` versions old."""
        return replace(self, correction=default_correction(self.correction, staleness, self.policy_loss).value)

    def _check_sequence_parallel(self) -> None:
        size = self.sequence_parallel_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"TrainerConfig.sequence_parallel_size={size!r} must be an integer >= 1 (1 = off)")
        if self.num_workers % size:
            raise ValueError(f"TrainerConfig.sequence_parallel_size={size} must divide num_workers="
                             f"{self.num_workers}: each group of {size} ranks shares its sequences; set num_workers "
                             f"to a multiple of {size}")
        if size > 1 and self.padding_free == "off":
            raise ValueError(f"TrainerConfig.sequence_parallel_size={size} slices packed micro-batches: it needs "
                             "padding_free=on or auto, not off")
        if not isinstance(self.hf_overrides, dict):
            raise ValueError(f"TrainerConfig.hf_overrides={self.hf_overrides!r} must be a mapping of config.json "
                             "fields to values")

    @property
    def data_parallel_size(self) -> int:
        """Groups of ranks that take different rows: num_workers / sequence_parallel_size."""
        return self.num_workers // self.sequence_parallel_size

    def _check_correction(self) -> None:
        names = [c.value for c in Correction]
        if self.correction not in names:
            raise ValueError(f"TrainerConfig.correction={self.correction!r}: choose one of {names}")
        sources = [p.value for p in ProximalSource]
        if self.proximal not in sources:
            raise ValueError(f"TrainerConfig.proximal={self.proximal!r}: choose one of {sources}")
        _check_positive(self, "is_threshold", "mask_low", "mask_high")
        if self.mask_low > self.mask_high:
            raise ValueError(f"TrainerConfig.mask_low={self.mask_low} exceeds mask_high={self.mask_high}; "
                             "set mask_low <= mask_high")
        correction = self.resolved_correction
        if correction in LOSS_CORRECTIONS and self.policy_loss not in ("vanilla", correction.value):
            raise ValueError(f"TrainerConfig.correction={correction.value!r} is itself a policy loss and contradicts "
                             f"policy_loss={self.policy_loss!r}; set policy_loss=vanilla or pick another correction")


def _check_positive(config: TrainerConfig, *names: str) -> None:
    for name in names:
        if not getattr(config, name) > 0:
            raise ValueError(f"TrainerConfig.{name}={getattr(config, name)!r} must be > 0")


def _check_non_negative(config: TrainerConfig, *names: str) -> None:
    for name in names:
        if getattr(config, name) < 0:
            raise ValueError(f"TrainerConfig.{name}={getattr(config, name)!r} must be >= 0")


# verl is installed apart from the resolver (its transformers pin conflicts with vLLM's; pyproject.toml says why)
VERL_VERSION = "0.9.1"  # the version both locks pin (tests/unit/test_packaging.py checks they agree)
VERL_INSTALL = f"pip install --no-deps verl=={VERL_VERSION}"
VERL_MISSING = (f"verl is not installed: the trainer is verl's. `make setup` installs it in a clone; else "
                f"`{VERL_INSTALL}` (--no-deps: verl {VERL_VERSION} declares transformers<5.11, vLLM needs "
                ">=5.16.1, and verl runs on the newer one); `fullasync doctor` checks the result")


def verl_module(name: str) -> ModuleType:
    """`import_module(name)` of a verl module, with what to do when verl is not installed."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "verl":
            raise
        raise ModuleNotFoundError(VERL_MISSING, name=error.name) from error


def _check_registered(field_name: str, name: str, registry: str, what: str) -> Callable[..., object]:
    """The entry `name` of verl's `core_algos.<registry>`; a ValueError naming the choices when it has none."""
    entries = getattr(verl_module("verl.trainer.ppo.core_algos"), registry)
    if name not in entries:
        raise ValueError(f"TrainerConfig.{field_name}={name!r} is not in verl's {what} registry; "
                         f"choose one of {sorted(entries)}")
    return entries[name]


def _check_advantage_estimator(name: str) -> None:
    """The estimator must exist and need no inputs beyond outcome rewards and group ids."""
    missing = estimator_missing_inputs(
        _check_registered("advantage_estimator", name, "ADV_ESTIMATOR_REGISTRY", "advantage"))
    if missing:
        raise ValueError(
            f"TrainerConfig.advantage_estimator={name!r} needs {missing}, which outcome-reward training does "
            f"not provide; choose an outcome estimator such as 'grpo', 'rloo' or 'reinforce_plus_plus'"
        )


def estimator_missing_inputs(estimator: Callable[..., object]) -> list[str]:
    """Required parameters of a verl advantage estimator that `build_batch` cannot supply."""
    parameters = inspect.signature(estimator).parameters.values()
    return [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in ESTIMATOR_INPUTS
    ]
