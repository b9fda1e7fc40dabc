"""The Terminus example's configuration: fullasync's `RunConfig` plus the adapter's knobs.

Owns: the Hydra structured schema (`TerminusTrainConfig`), every field declared with its one-line help
(`train.py --help` prints them all), and the defaults sized for a 2-core machine (a 4,096-token context:
harbor's Terminus-2 prompt alone is ~1,600 tokens of the tiny tokenizer; the others are the adapter's own,
`TerminusConfig`); `agent_config()` turns the `agent` section, with the engines' context length, into the
adapter's frozen `TerminusConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from examples.harness_train import HarnessTrainConfig, agent_kwargs
from fullasync.config import EngineSection, ModelSection, RolloutSection, section, setting
from fullasync_agents.terminus import TerminusConfig

TASK_SETS = ("settings", "commands")  # fullasync_agents.terminal_tasks: settings.setting_rows | rows
BUILTIN_POLICY = "builtin:terminus"  # the tiny policy warmed up by examples/terminus/warmup.py (built, cached)
CONTEXT = 4096


@dataclass
class AgentSection:
    model_name: str = setting(f"hosted_vllm/{ModelSection.served_name}", "litellm model name Terminus-2 uses "
                              "against the gateway (provider/model.served_name)")
    temperature: float = setting(0.7, "sampling temperature of every model call (= trainer.temperature)")
    max_tokens: int = setting(192, "output budget of one model call (below engine.max_model_len, which is also "
                              "litellm's max_input_tokens)")
    max_turns: int = setting(3, "Terminus-2 turns per episode (a solved task takes two: act, then confirm)")
    pane_width: int = setting(TerminusConfig.pane_width, "tmux pane columns")
    pane_height: int = setting(TerminusConfig.pane_height, "tmux pane rows")
    agent_timeout_s: float = setting(TerminusConfig.agent_timeout_s, "harbor's agent timeout; the trial is verified "
                                     "after it, so a slow machine scores 0 (0 = the task's own, 120 s for settings)")
    episode_timeout_s: float = setting(TerminusConfig.episode_timeout_s, "hard kill of the harness and everything "
                                       "it started")
    environment_type: str = setting(TerminusConfig.environment_type, "local (namespace sandbox) | container (each "
                                    "task's image in a container of ours, no network, limits and budgets; make "
                                    "setup-containers) | docker | podman (harbor's own, unchanged)")
    summarize: bool = setting(False, "Terminus-2 hands a full context over to a fresh one with a summary (the "
                              "adapter's default is on, as harbor's; off here: the example's results were measured "
                              "without, and a 4,096-token context holds little beside harbor's 1,600-token prompt)")
    harbor_python: str = setting(TerminusConfig.harbor_python, "the harbor interpreter (\"\" = "
                                 "$FULLASYNC_HARBOR_PYTHON or .venv-harbor)")
    hint: bool = setting(True, "each task's extra instruction names the command (what a tiny policy can learn); "
                         "false for real models")
    tasks: str = setting("settings", "settings (one name to copy: what the tiny policy learns) | commands (the 20 "
                         "shipped tasks, a whole command to copy; for bigger models)")


@dataclass
class TerminusTrainConfig(HarnessTrainConfig):
    """`RunConfig` with an `agent` section; the fields redeclared here and in `HarnessTrainConfig` change defaults
    only (help: RunConfig's)."""

    TASK_SETS = TASK_SETS

    agent: AgentSection = section(AgentSection, "how Terminus-2 runs an episode (the adapter's TerminusConfig)")
    model: ModelSection = field(default_factory=lambda: ModelSection(path=BUILTIN_POLICY))
    engine: EngineSection = field(default_factory=lambda: EngineSection(max_model_len=CONTEXT))
    rollout: RolloutSection = field(default_factory=lambda: RolloutSection(
        n=4, batch_size=4, max_running_rows=6, episode_timeout_s=400.0))
    total_steps: int = 20
    output_dir: str = "outputs/terminus"

    def validate(self) -> None:
        if self.agent.max_tokens >= self.engine.max_model_len:
            raise ValueError(f"agent.max_tokens={self.agent.max_tokens} must be below engine.max_model_len="
                             f"{self.engine.max_model_len}; lower agent.max_tokens or raise engine.max_model_len")
        super().validate()

    def agent_config(self) -> TerminusConfig:
        """The adapter's config: the `agent` section, and the engines' context length as Terminus-2's context."""
        return TerminusConfig(**agent_kwargs(self.agent), context_length=self.engine.max_model_len)
