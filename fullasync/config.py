"""The run configuration: dataclasses that are also Hydra structured configs.

Owns: every knob of a training run (each field's comment is its help text), the meaning of
`mode`, and the cross-field checks run at start-up; each error names the field and the fix.
Does not own: the trainer's own knobs (`fullasync.trainer.config.TrainerConfig`, nested here).
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from dataclasses import dataclass, field
from typing import Any

from fullasync.engines.protocol import PauseMode
from fullasync.placement import check_ray_resources
from fullasync.trainer.config import PROXIMAL_CORRECTIONS, Correction, TrainerConfig, default_correction

BUILTIN_MODEL = "builtin:arithmetic"  # the warm-started tiny policy of the built-in task
RESUME_MAY_CHANGE = (  # fields (or sections, ending in ".") a resumed run may set differently from its checkpoint
    "total_steps", "output_dir", "resume", "val_every", "val_samples_per_row", "save_checkpoint", "tensorboard",
    "wandb_project", "worker_logs", "checkpoint.", "engine.", "rollout.episode_timeout_s", "rollout.resume_timeout_s",
    "trainer.start_timeout_s", "trainer.call_timeout_s", "trainer.worker_threads",
    "trainer.worker_num_cpus", "trainer.ray_resources", "trainer.checkpoint_dir",
)


class Mode(str, enum.Enum):
    SYNC = "sync"  # generate a batch with the current weights, then train on it (on-policy baseline)
    ONE_STEP_OFF = "one_step_off"  # generate batch k+1 while training on batch k; push between batches
    FULLY_ASYNC = "fully_async"  # generate continuously; tokens at most max_staleness versions old


@dataclass
class ModelSection:
    path: str = BUILTIN_MODEL  # local HF model dir, builtin:arithmetic, or a named model (smollm2-135m-instruct)
    served_name: str = "policy"  # the `model` name harnesses pass to the client
    chat_template: str = ""  # override the model's chat template: a Jinja file or a built-in name (chatml-tools)
    tool_parser: str = "hermes"  # format of tool calls in the output (fullasync.client.tool_parsers)

    def validate(self) -> None:
        """Cheap checks of the names (the template + parser fit is checked once the tokenizer is loaded)."""
        from fullasync.client.tool_parsers import TOOL_PARSERS
        from fullasync.models.chat_templates import read_chat_template_source

        if self.tool_parser not in TOOL_PARSERS:
            raise ValueError(f"model.tool_parser={self.tool_parser!r} is unknown; choose one of {sorted(TOOL_PARSERS)}")
        if self.chat_template:
            read_chat_template_source(self.chat_template)


@dataclass
class EngineSection:
    num_engines: int = 1  # vLLM engines (Ray actors)
    dtype: str = "float32"  # engine dtype; float32 matches the trainer's log-probs
    max_model_len: int = 1024  # context length (prompt + output)
    max_num_seqs: int = 128  # concurrent sequences per engine
    stall_timeout_s: float = 120.0  # an engine with in-flight requests and no new token this long is declared dead
    probe_interval_s: float = 5.0  # how often the engine watchdog probes each engine
    restart_on_failure: bool = True  # restart a dead engine with the current weights (else the run stops)
    start_timeout_s: float = 300.0  # bound on starting (or restarting) an engine
    kv_cache_mb: int = 0  # KV cache per engine in MiB; 0 = the platform default (CPU: 64 MiB; GPU: 85% of memory)
    ray_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per engine: pins its node


@dataclass
class RolloutSection:
    n: int = 8  # episodes per dataset row (group size)
    batch_size: int = 8  # groups per train step
    max_running_rows: int = 16  # rows generating at once (bounded further by the staleness rule)
    episode_timeout_s: float = 300.0  # an episode running longer is cancelled and counted as failed
    filter_zero_variance: bool = False  # drop groups whose rewards are all equal (counted as filtered)
    resume_timeout_s: float = 300.0  # how long an interrupted generation waits for the engines to resume


@dataclass
class DataSection:
    task: str = "arithmetic"  # built-in task providing data and rollout_fn; "" when both are given below
    rollout_fn: str = ""  # dotted path `pkg.module:function` of `async def rollout_fn(client, row)`
    train_dataset: str = ""  # dotted path to a function returning an iterable of rows (or a datasets.Dataset)
    val_dataset: str = ""  # same, for validation rows
    epochs: int = 20  # passes over the training rows; the run ends at total_steps or when they are consumed
    max_train_rows: int = 0  # train on the first this many rows only (0 = all)


@dataclass
class CheckpointSection:
    every: int = 10  # save the whole run every this many steps, and after the last (0 = only on SIGTERM/SIGINT)
    keep: int = 2  # newest complete checkpoints kept under output_dir/checkpoints (0 = all)


@dataclass
class RunConfig:
    mode: str = "fully_async"  # sync | one_step_off | fully_async
    max_staleness: int = -1  # fully_async: max trainer_version − token_version; -1 = mode default (sync 0, one_step_off 1, fully_async 2)
    partial_rollout: bool = True  # fully_async: interrupt generations at a push and resume them under new weights
    total_steps: int = 60  # train steps to run; 0 = until the rows of all epochs are consumed
    val_every: int = 0  # validate every this many steps (0 = only before and after training)
    val_samples_per_row: int = 16  # episodes per validation row (accuracy = mean reward)
    output_dir: str = "outputs/run"  # metrics.jsonl, result.json and checkpoints/ go here
    resume: str = "auto"  # auto: continue the newest checkpoint in output_dir if any | never | a checkpoint directory
    save_checkpoint: bool = False  # save the final policy in HF format under output_dir/checkpoint
    tensorboard: bool = False  # also log to TensorBoard under output_dir/tensorboard
    wandb_project: str = ""  # also log to Weights & Biases (when installed)
    seed: int = 0  # seeds sampling in the engines and the trainer
    worker_logs: bool = False  # show the Ray workers' console output (vLLM, verl) here; else it stays in Ray's logs
    model: ModelSection = field(default_factory=ModelSection)
    engine: EngineSection = field(default_factory=EngineSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    data: DataSection = field(default_factory=DataSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    # Sized for the built-in task. trainer.correction=auto applies the default off-policy correction
    # (GSPO, see docs/staleness_study.md) whenever staleness > 0, plain PPO when the data is on-policy.
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=5e-4, micro_batch_size=32))

    def fingerprint(self) -> dict[str, Any]:
        """The fields a resumed run must share with the run that wrote the checkpoint (flattened, dotted names).

        Left out, free to change on resume: how long to run, where and how to log, timeouts, checkpointing,
        and the engines (how many, where, their sizes)."""
        def flatten(prefix: str, value: Any) -> dict[str, Any]:
            if dataclasses.is_dataclass(value):
                return {k: v for f in dataclasses.fields(value)
                        for k, v in flatten(f"{prefix}{f.name}.", getattr(value, f.name)).items()}
            return {prefix[:-1]: value.value if isinstance(value, enum.Enum) else value}

        return {key: value for key, value in flatten("", self).items()
                if not any(key == free or key.startswith(free) for free in RESUME_MAY_CHANGE)}

    @property
    def staleness(self) -> int:
        """The effective max_staleness for the mode."""
        if self.max_staleness >= 0:
            return self.max_staleness
        return {Mode.SYNC: 0, Mode.ONE_STEP_OFF: 1, Mode.FULLY_ASYNC: 2}[Mode(self.mode)]

    @property
    def push_mode(self) -> PauseMode:
        """How in-flight generations meet a weight push."""
        if Mode(self.mode) is Mode.FULLY_ASYNC and self.partial_rollout:
            return PauseMode.ABORT  # interrupted, resumed under the new weights
        return PauseMode.WAIT  # finished under the weights they started with

    @property
    def correction(self) -> Correction:
        """The off-policy correction of this run: trainer.correction, with `auto` resolved by staleness."""
        return default_correction(self.trainer.correction, self.staleness, self.trainer.policy_loss)

    def resolved_trainer(self) -> TrainerConfig:
        """The trainer's config with `auto` resolved for this run's staleness (what VerlTrainer gets)."""
        return self.trainer.for_staleness(self.staleness)

    def correction_summary(self, trainer: TrainerConfig | None = None) -> str:
        """One start-up line: the correction the trainer applies and why (`trainer`: a caller's own config)."""
        used = trainer if trainer is not None else self.resolved_trainer()
        correction = used.resolved_correction
        if trainer is not None and correction is not self.correction:
            why = "set on the given trainer"
        elif self.trainer.correction == Correction.AUTO.value and self.staleness > 0 and correction is Correction.NONE:
            why = f"policy_loss={self.trainer.policy_loss} chosen, applied to the behaviour log-probs as is"
        elif self.trainer.correction == Correction.AUTO.value:
            why = f"default for max_staleness={self.staleness}"
        else:
            why = "chosen"
        proximal = f", proximal={used.proximal}" if correction in PROXIMAL_CORRECTIONS else ""
        return f"correction={correction.value} ({why}{proximal})"

    def validate(self) -> None:
        """Cross-field checks; each error says which field and how to fix it."""
        if self.mode not in {m.value for m in Mode}:
            raise ValueError(f"mode={self.mode!r} is not a mode; choose one of {[m.value for m in Mode]}")
        mode = Mode(self.mode)
        if mode is Mode.SYNC and self.max_staleness not in (-1, 0):
            raise ValueError(f"max_staleness={self.max_staleness} contradicts mode=sync (on-policy); "
                             "drop max_staleness or use mode=fully_async")
        if mode is Mode.ONE_STEP_OFF and self.max_staleness not in (-1, 1):
            raise ValueError(f"max_staleness={self.max_staleness} contradicts mode=one_step_off (always 1); "
                             "drop max_staleness or use mode=fully_async")
        if self.max_staleness < -1:
            raise ValueError(f"max_staleness={self.max_staleness} must be >= 0 (or -1 for the mode default)")
        for name in ("n", "batch_size", "max_running_rows"):
            if getattr(self.rollout, name) < 1:
                raise ValueError(f"rollout.{name}={getattr(self.rollout, name)} must be >= 1")
        if self.rollout.n < 2 and self.trainer.advantage_estimator in ("grpo", "rloo"):
            raise ValueError(f"rollout.n=1 gives {self.trainer.advantage_estimator} no group to compare; "
                             "set rollout.n >= 2 or trainer.advantage_estimator=reinforce_plus_plus")
        if not 0 < self.engine.probe_interval_s < self.engine.stall_timeout_s:
            raise ValueError(f"engine.probe_interval_s={self.engine.probe_interval_s} must be > 0 and below "
                             f"engine.stall_timeout_s={self.engine.stall_timeout_s}")
        check_ray_resources("engine.ray_resources", self.engine.ray_resources)
        if self.engine.kv_cache_mb < 0:
            raise ValueError(f"engine.kv_cache_mb={self.engine.kv_cache_mb} must be >= 0 (0 = the platform default)")
        if self.total_steps < 0 or self.data.epochs < 1 or self.data.max_train_rows < 0:
            raise ValueError("total_steps and data.max_train_rows must be >= 0 and data.epochs >= 1")
        if self.checkpoint.every < 0 or self.checkpoint.keep < 0:
            raise ValueError(f"checkpoint.every={self.checkpoint.every} and checkpoint.keep={self.checkpoint.keep} "
                             "must be >= 0")
        self.trainer.validate()
        if self.staleness > 0 and self.trainer.correction == Correction.NONE.value:
            warnings.warn(f"trainer.correction=none with max_staleness={self.staleness}: stale tokens are trained "
                          "with plain PPO against the policy that sampled them; drop trainer.correction (auto) "
                          "for the default correction", UserWarning, stacklevel=2)
