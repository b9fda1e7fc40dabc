"""The mini-swe example's configuration: fullasync's `RunConfig` plus the adapter's and the warm-up's knobs.

Owns: the Hydra structured schema (`MiniSweTrainConfig`) and the defaults sized for this 2-core machine;
`agent_config()` turns the `agent` section into the adapter's frozen `MiniSweConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fullasync_agents.mini_swe import MiniSweConfig

from examples.harness_train import EvaluationSection, agent_kwargs
from fullasync.config import DataSection, ModelSection, RolloutSection, RunConfig
from fullasync.trainer.config import TrainerConfig

BUILTIN_POLICY = "builtin:mini_swe"  # the tiny policy warmed up by examples/mini_swe/warmup.py (built, cached)


@dataclass
class AgentSection:
    action_format: str = "text"  # text (```mswea_bash_command) | tool_call (the bash tool)
    model_name: str = "hosted_vllm/policy"  # litellm model name mini-swe-agent uses against the gateway
    temperature: float = 1.0  # sampling temperature of every model call
    max_tokens: int = 96  # output budget of one model call
    step_limit: int = 3  # model calls per episode
    episode_timeout_s: float = 300.0  # hard kill of the harness and everything it started
    command_timeout_s: int = 10  # one bash command's limit
    templates_from: str = ""  # a mini-swe-agent YAML config whose templates to use (e.g. its mini.yaml, real models)
    environment_class: str = "local"  # local | docker (passed through to mini-swe-agent; needs a daemon)
    hint: bool = True  # the issue names the edit (what a tiny policy can learn); false for real models


@dataclass
class MiniSweTrainConfig(RunConfig):
    agent: AgentSection = field(default_factory=AgentSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    model: ModelSection = field(default_factory=lambda: ModelSection(path=BUILTIN_POLICY))
    data: DataSection = field(default_factory=lambda: DataSection(task="", epochs=4))
    rollout: RolloutSection = field(default_factory=lambda: RolloutSection(
        n=4, batch_size=2, max_running_rows=4, episode_timeout_s=400.0))
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=5e-4, micro_batch_size=8))
    total_steps: int = 20
    output_dir: str = "outputs/mini_swe"

    def agent_config(self) -> MiniSweConfig:
        return MiniSweConfig(**agent_kwargs(self.agent))
