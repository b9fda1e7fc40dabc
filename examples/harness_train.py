"""What the harness examples (`examples/mini_swe`, `examples/terminus`) share around training.

Owns: the defaults both examples train with (`HarnessTrainConfig`), their one `main` and run (`HarnessExample`:
what differs between them is data), the adapter's kwargs from an `agent` section, the generator mixin
that counts the weight versions each episode's tokens came from, the run itself with its summary
(`<output_dir>/summary.json`: held-out solve rate before and after with binomial standard errors, wall
time, episodes/s, a per-episode count, exits, episodes a weight push landed in) and the closing lines.
Does not own: the task sets, the adapters' configs or the warm-up policies (each example's own modules).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fullasync.config import DataSection, RunConfig, TrainerConfig


@dataclass
class HarnessTrainConfig(RunConfig):
    """What both harness examples train with; each adds its `agent` section, its task sets and its sizes."""

    TASK_SETS: ClassVar[tuple[str, ...]] = ()  # the `agent.tasks` choices (the example's task families)

    data: DataSection = field(default_factory=lambda: DataSection(task="", epochs=4))
    # each episode weighs alike (seq-mean-token-mean): with token-mean the long failed turns (format errors, 96
    # tokens of noise) carried most of the gradient and the policy collapsed to empty replies; lr 5e-4 collapsed it
    # too; T = 0.7 (sampling and the trainer's logits alike) keeps the one-token typos of T = 1 out; a KL penalty
    # to the warm policy keeps what the reward does not see (mini-swe's submit call; Terminus-2's replies, which
    # otherwise drifted into overflowing the context or harbor's agent timeout) from drifting into noise (READMEs)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(
        lr=2e-4, micro_batch_size=8, loss_agg_mode="seq-mean-token-mean", temperature=0.7, kl_coef=0.1))
    val_samples_per_row: int = 4

    def validate(self) -> None:
        super().validate()
        check_run_against_agent(self, self.TASK_SETS)


def agent_kwargs(section: Any) -> dict[str, Any]:
    """The adapter config's kwargs from an example's `agent` section (`hint` and `tasks` belong to the task set)."""
    return {key: value for key, value in asdict(section).items() if key not in ("hint", "tasks")}


class TracksWeightVersions:
    """Mixed in before an adapter: counts the weight versions each episode's tokens came from (pushes that
    landed mid-episode) and the episodes with a generation interrupted and resumed."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.episodes_spanning_versions = 0
        self.episodes_with_resumed_calls = 0
        self.episodes = 0

    async def generate(self, episode, row):
        try:
            return await super().generate(episode, row)
        finally:
            calls = episode.client.episode.calls
            self.episodes += 1
            self.episodes_spanning_versions += len({v for call in calls for v in call.output_versions}) > 1
            self.episodes_with_resumed_calls += any(call.num_resumes for call in calls)


def check_served_name(agent_model_name: str, served_name: str) -> None:
    """A litellm-style `hosted_vllm/<name>` must name the policy the gateway serves."""
    if agent_model_name.partition("/")[2] != served_name:
        raise ValueError(f"agent.model_name={agent_model_name!r} does not name model.served_name={served_name!r}; "
                         f"set agent.model_name=hosted_vllm/{served_name}")


def check_run_against_agent(config, task_sets: tuple[str, ...]) -> None:
    """The task set must be one of `task_sets`; the harness must ask the gateway for the served model, and sample at
    the temperature the trainer divides logits by (otherwise every trained token's log-prob is off-policy by the
    difference); the adapter's own checks run too, before anything starts (their field names are the `agent`
    section's)."""
    if config.agent.tasks not in task_sets:
        raise ValueError(f"agent.tasks={config.agent.tasks!r}; choose one of {task_sets}")
    check_served_name(config.agent.model_name, config.model.served_name)
    if config.agent.temperature != config.trainer.temperature:
        raise ValueError(f"agent.temperature={config.agent.temperature} differs from trainer.temperature="
                         f"{config.trainer.temperature}; set both (the trainer divides logits by its temperature)")
    try:
        config.agent_config()
    except ValueError as error:
        raise ValueError(f"agent.{error}") from error


def solve_rate(mean: float | None, episodes: int) -> dict[str, float | None]:
    """The held-out solve rate with its binomial standard error over `episodes`."""
    if mean is None:
        return {"rate": None, "stderr": None}
    return {"rate": mean, "stderr": math.sqrt(max(mean * (1 - mean), 0.0) / episodes)}


async def train_and_summarize(config, generator: TracksWeightVersions, train: list[dict[str, Any]],
                              held_out: list[dict[str, Any]], started: float, per_episode_key: str,
                              per_episode: Callable[[], list[int]]) -> dict[str, Any]:
    """Train `generator` on `train` (held-out evaluation before and after), write and return the summary;
    `per_episode()` is the generator's count for each finished episode, averaged under `per_episode_key`."""
    from fullasync.api import AsyncAgentTrainer

    result = await AsyncAgentTrainer(config, rollout_fn=generator, train_dataset=train,
                                     val_dataset=held_out).train_async()
    episodes = len(held_out) * config.val_samples_per_row
    counts = per_episode()
    summary = {
        "wall_s": time.monotonic() - started,
        **result.summary(),
        "held_out_before": solve_rate(result.val_before, episodes),
        "held_out_after": solve_rate(result.val_after, episodes),
        "held_out_episodes": episodes,
        "trained_episodes_per_s": result.samples_per_s,
        per_episode_key: sum(counts) / len(counts) if counts else 0.0,
        "exit_statuses": dict(generator.exit_statuses),
        "episodes": generator.episodes,
        "episodes_spanning_weight_versions": generator.episodes_spanning_versions,
        "episodes_with_resumed_calls": generator.episodes_with_resumed_calls,
    }
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def report(summary: dict[str, Any], tag: str, per_episode_key: str, per_episode_words: str) -> str:
    """The closing lines, each starting `[tag]`; `per_episode_words` names the count (e.g. "model calls")."""
    before, after = summary["held_out_before"], summary["held_out_after"]
    rate = "{rate:.3f} ± {stderr:.3f}".format
    return "\n".join([
        f"[{tag}] held-out solve rate {rate(**before)} → {rate(**after)} "
        f"({summary['held_out_episodes']} episodes each, binomial standard errors)",
        f"[{tag}] {summary['steps']} steps, wall {summary['wall_s']:.0f} s (training {summary['train_wall_s']:.0f} s), "
        f"{summary['trained_episodes_per_s']:.3f} trained episodes/s, {summary[per_episode_key]:.2f} "
        f"{per_episode_words} per episode; rows {summary['rows']}; failures {summary['episode_failures']}",
        f"[{tag}] exits {summary['exit_statuses']}; of {summary['episodes']} episodes, "
        f"{summary['episodes_spanning_weight_versions']} spanned weight versions (a push landed mid-episode), "
        f"{summary['episodes_with_resumed_calls']} had a generation interrupted and resumed",
    ])


@dataclass(frozen=True)
class HarnessExample:
    """One harness example: what differs between mini-swe and Terminus-2 around the same run and `main`."""

    tag: str  # "mini_swe": the closing lines' prefix and the Hydra schema's name (`<tag>_schema`)
    schema: type[HarnessTrainConfig]
    builtin_policy: str  # `model.path` meaning the example's warm tiny policy, built (once) by `warm_policy`
    warm_policy: Callable[[Any], Path]  # config → the warm policy's folder
    task_families: Callable[[], dict[str, Callable[..., list[dict[str, Any]]]]]  # `agent.tasks` → its rows(split, hint)
    generator: Callable[[Any], Any]  # config → the adapter, with `TracksWeightVersions` mixed in
    per_episode: tuple[str, str, Callable[[Any], list[int]]]  # summary key, its words, the generator's counts

    def __post_init__(self) -> None:
        from hydra.core.config_store import ConfigStore

        from fullasync.config.compose import schema_node

        ConfigStore.instance().store(name=f"{self.tag}_schema", node=schema_node(self.schema))  # train.yaml's defaults

    async def run(self, config: Any) -> dict[str, Any]:
        """Build the warm policy when asked for, train on the task set, and return (and write) the summary."""
        started = time.monotonic()
        if config.model.path == self.builtin_policy:
            config.model.path = str(self.warm_policy(config))
            print(f"[{self.tag}] warm policy {config.model.path} ready in {time.monotonic() - started:.0f} s",
                  flush=True)
        rows = self.task_families()[config.agent.tasks]
        train, held_out = rows("train", hint=config.agent.hint), rows("held_out", hint=config.agent.hint)
        generator = self.generator(config)
        key, _, counts = self.per_episode
        return await train_and_summarize(config, generator, train, held_out, started, key, lambda: counts(generator))

    def report(self, summary: dict[str, Any]) -> str:
        key, words, _ = self.per_episode
        return report(summary, self.tag, key, words)

    def main(self, doc: str, config_dir: Path) -> None:
        """`python -m examples.<tag>.train [overrides]`: `--help` prints every field; otherwise Hydra composes
        `config_dir/train.yaml` with the overrides, and the run's closing lines are printed."""
        import hydra

        from fullasync.config.compose import build_config
        from fullasync.config.doc import exit_with_help_if_asked
        from fullasync.engines.vllm.args import engine_arg_names
        from fullasync.observe.logs import configure_logging

        exit_with_help_if_asked(sys.argv[1:], self.schema, doc, config_dir / "train.yaml")

        @hydra.main(config_path=str(config_dir), config_name="train", version_base=None)
        def train(cfg: Any) -> None:
            configure_logging()
            try:
                config = build_config(cfg, self.schema, engine_arg_names)
                config.validate()
            except ValueError as error:
                print(f"{self.tag}: invalid configuration: {error}", file=sys.stderr)
                raise SystemExit(2) from None
            print(self.report(asyncio.run(self.run(config))), flush=True)

        train()
