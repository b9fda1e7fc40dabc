"""The Terminus example's configuration: fullasync's `RunConfig` plus the adapter's and the evaluation's knobs.

Owns: the Hydra structured schema (`TerminusTrainConfig`) and the defaults sized for this 2-core machine
(a 4,096-token context: harbor's Terminus-2 prompt alone is ~1,600 tokens of the tiny tokenizer);
`agent_config()` turns the `agent` section into the adapter's frozen `TerminusConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fullasync_agents.terminus import TerminusConfig

from examples.harness_train import EvaluationSection, agent_kwargs
from fullasync.config import DataSection, EngineSection, ModelSection, RolloutSection, RunConfig
from fullasync.trainer.config import TrainerConfig

BUILTIN_POLICY = "builtin:terminus"  # the tiny policy warmed up by examples/terminus/warmup.py (built, cached)
CONTEXT = 4096


@dataclass
class AgentSection:
    model_name: str = "hosted_vllm/policy"  # litellm model name Terminus-2 uses against the gateway
    temperature: float = 1.0  # sampling temperature of every model call
    max_tokens: int = 192  # output budget of one model call
    context_length: int = CONTEXT  # litellm model_info.max_input_tokens (keep equal to engine.max_model_len)
    max_turns: int = 3  # Terminus-2 turns per episode (a solved task takes two: act, then confirm)
    pane_width: int = 80  # tmux pane columns
    pane_height: int = 24  # tmux pane rows
    episode_timeout_s: float = 300.0  # hard kill of the harness and everything it started
    environment_type: str = "local"  # local (namespace sandbox) | docker | podman (harbor's own; needs a daemon)
    harbor_python: str = ""  # the harbor interpreter ("" = $FULLASYNC_HARBOR_PYTHON or .venv-harbor)
    hint: bool = True  # each task's extra instruction names the command (what a tiny policy can learn); false for real models


@dataclass
class TerminusTrainConfig(RunConfig):
    agent: AgentSection = field(default_factory=AgentSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    model: ModelSection = field(default_factory=lambda: ModelSection(path=BUILTIN_POLICY))
    engine: EngineSection = field(default_factory=lambda: EngineSection(max_model_len=CONTEXT))
    data: DataSection = field(default_factory=lambda: DataSection(task="", epochs=4))
    rollout: RolloutSection = field(default_factory=lambda: RolloutSection(
        n=4, batch_size=2, max_running_rows=4, episode_timeout_s=400.0))
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=5e-4, micro_batch_size=8))
    total_steps: int = 20
    output_dir: str = "outputs/terminus"

    def agent_config(self) -> TerminusConfig:
        return TerminusConfig(**agent_kwargs(self.agent))
