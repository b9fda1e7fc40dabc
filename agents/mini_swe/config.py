"""How mini-swe-agent is run for an episode: `MiniSweConfig` (a frozen dataclass, also a Hydra structured config).

Owns: every knob of the adapter (each field's comment is its help), their start-up checks (errors name
the field and the fix), and the default prompt templates. The templates are mini-swe-agent
*configuration* (its `DefaultAgent` takes `system_template` / `instance_template`), not a change to its
code; the defaults here are short, for a small context, and `templates_from` loads the ones
mini-swe-agent ships (e.g. `mini.yaml`) for a real model. Does not own: running anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fullasync_agents.containers import ContainerSettings

ACTION_FORMATS = ("text", "tool_call")  # LitellmTextbasedModel (```mswea_bash_command) | LitellmModel (bash tool)
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # LocalEnvironment's end-of-task signal

SYSTEM_TEMPLATE = (
    "You fix a bug in a Python repository with bash commands.\n"
    "Reply with exactly one command in a ```mswea_bash_command block.\n"
    f"When the bug is fixed, run: {SUBMIT_COMMAND}"
)
TOOL_SYSTEM_TEMPLATE = (
    "You fix a bug in a Python repository with the bash tool, one command per reply.\n"
    f"When the bug is fixed, run: {SUBMIT_COMMAND}"
)
INSTANCE_TEMPLATE = "{{task}}"
OBSERVATION_TEMPLATE = "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>"


@dataclass(frozen=True)
class MiniSweConfig:
    action_format: str = "text"  # text: LitellmTextbasedModel (```mswea_bash_command); tool_call: LitellmModel
    model_name: str = "hosted_vllm/policy"  # litellm model name; the part after the provider is the served model name
    temperature: float = 1.0  # sampling temperature of every model call
    max_tokens: int = 96  # output budget of one model call
    step_limit: int = 4  # model calls per episode (DefaultAgent step_limit); then LimitsExceeded
    max_format_errors: int = 3  # DefaultAgent max_consecutive_format_errors; then RepeatedFormatError
    agent_wall_time_s: int = 0  # DefaultAgent's own wall_time_limit_seconds (0: none; the hard kill still applies)
    episode_timeout_s: float = 120.0  # hard limit: the harness and every process it started are killed
    command_timeout_s: int = 10  # LocalEnvironment timeout of one bash command
    score_timeout_s: float = 60.0  # hidden tests running longer score 0
    model_retries: int = 1  # MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT: attempts per call (1: a failed call ends it)
    system_template: str = ""  # "" = the adapter's short default for action_format
    instance_template: str = INSTANCE_TEMPLATE  # jinja; {{task}} is the row's instruction
    observation_template: str = OBSERVATION_TEMPLATE  # jinja over `output` (returncode, output, exception_info)
    templates_from: str = ""  # a mini-swe-agent YAML config (e.g. its mini.yaml) whose agent/model templates win
    # where commands run: local (a copy of the row's repository on the host) | container (the row's own container,
    # SWE-bench-style rows: mini-swe-agent's DockerEnvironment attached to it; `container` sets how it starts) |
    # docker (mini-swe-agent starts its own; environment.image) | a class path
    environment_class: str = "local"
    container: ContainerSettings = field(default_factory=ContainerSettings)
    environment: dict[str, Any] = field(default_factory=dict)  # extra environment kwargs; "{repo}" = sandbox path
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # extra litellm kwargs for every call (e.g. top_p)
    sandbox_parent: str = ""  # where episode sandboxes are created ("" = the system temp dir)

    def __post_init__(self) -> None:
        if self.action_format not in ACTION_FORMATS:
            raise ValueError(f"action_format={self.action_format!r}; choose one of {ACTION_FORMATS}")
        if "/" not in self.model_name:
            raise ValueError(f"model_name={self.model_name!r} needs a litellm provider, e.g. 'hosted_vllm/policy'")
        for name in ("max_tokens", "step_limit", "command_timeout_s", "model_retries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.episode_timeout_s <= 0 or self.score_timeout_s <= 0:
            raise ValueError("episode_timeout_s and score_timeout_s must be > 0")

    @property
    def resolved_system_template(self) -> str:
        if self.system_template:
            return self.system_template
        return SYSTEM_TEMPLATE if self.action_format == "text" else TOOL_SYSTEM_TEMPLATE
