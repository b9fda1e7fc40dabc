"""The mini-swe example's configuration: fullasync's `RunConfig` plus the adapter's knobs.

Owns: the Hydra structured schema (`MiniSweTrainConfig`), every field declared with its one-line help
(`train.py --help` prints them all), and the defaults sized for a 2-core machine (the others are the adapter's
own, `MiniSweConfig`); `agent_config()` turns the `agent` section into the adapter's frozen `MiniSweConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from examples.harness_train import HarnessTrainConfig, agent_kwargs
from fullasync.config import ModelSection, RolloutSection, section, setting
from fullasync_agents.mini_swe import MiniSweConfig

# fullasync_agents.swe_tasks: settings.setting_rows | tasks.rows | the settings family as SWE-bench-style records
TASK_SETS = ("settings", "bugs", "swe-settings")
BUILTIN_POLICY = "builtin:mini_swe"  # the tiny policy warmed up by examples/mini_swe/warmup.py (built, cached)


@dataclass
class AgentSection:
    action_format: str = setting(MiniSweConfig.action_format, "text (```mswea_bash_command) | tool_call (the bash "
                                 "tool)")
    model_name: str = setting(f"hosted_vllm/{ModelSection.served_name}", "litellm model name mini-swe-agent uses "
                              "against the gateway (provider/model.served_name)")
    temperature: float = setting(0.7, "sampling temperature of every model call (= trainer.temperature)")
    max_tokens: int = setting(MiniSweConfig.max_tokens, "output budget of one model call")
    step_limit: int = setting(2, "model calls per episode (the fix and the submission)")
    episode_timeout_s: float = setting(300.0, "hard kill of the harness and everything it started")
    command_timeout_s: int = setting(MiniSweConfig.command_timeout_s, "one bash command's limit")
    templates_from: str = setting(MiniSweConfig.templates_from, "a mini-swe-agent YAML config whose templates to "
                                  "use (e.g. its mini.yaml, real models)")
    environment_class: str = setting(MiniSweConfig.environment_class, "local (a copy of the repository) | container "
                                     "(the row's container: SWE-bench-style rows; make setup-containers) | docker "
                                     "(mini-swe-agent's own)")
    hint: bool = setting(True, "the issue names the edit (what a tiny policy can learn); false for real models")
    tasks: str = setting("settings", "settings (one name to copy: what the tiny policy learns) | bugs (30 seeded "
                         "bugs needing ~30 tokens copied; for bigger models) | swe-settings (the settings family "
                         "as SWE-bench-style records, each in its own container: environment_class=container)")


@dataclass
class MiniSweTrainConfig(HarnessTrainConfig):
    """`RunConfig` with an `agent` section; the fields redeclared here and in `HarnessTrainConfig` change defaults
    only (help: RunConfig's)."""

    TASK_SETS = TASK_SETS

    agent: AgentSection = section(AgentSection, "how mini-swe-agent runs an episode (the adapter's MiniSweConfig)")
    model: ModelSection = field(default_factory=lambda: ModelSection(path=BUILTIN_POLICY))
    rollout: RolloutSection = field(default_factory=lambda: RolloutSection(
        n=4, batch_size=4, max_running_rows=8, episode_timeout_s=400.0))
    total_steps: int = 25
    output_dir: str = "outputs/mini_swe"

    def validate(self) -> None:
        super().validate()
        if self.agent.tasks == "swe-settings" and self.agent.environment_class != "container":
            raise ValueError("agent.tasks=swe-settings runs each row in its container: set "
                             "agent.environment_class=container (after make setup-containers)")

    def agent_config(self) -> MiniSweConfig:
        return MiniSweConfig(**agent_kwargs(self.agent))
