"""What crosses the zygote boundary for mini-swe-agent: one episode's spec in, the agent's outcome back.

Owns: `MiniSweSpec` (made by `MiniSweAgentGenerator.episode_spec`, read by `runner.run_episode`) and
`MiniSweOutcome` (made by `runner.run_episode`, read by the generator), both checked on receipt
(`fullasync_agents.messages`). Stdlib only: the harness process loads it without fullasync's stack.
Does not own: what the fields mean to mini-swe-agent (its `DefaultAgent`, litellm models, environments).
"""

from __future__ import annotations

from dataclasses import dataclass

from fullasync.types import JsonValue
from fullasync_agents.messages import Message


@dataclass(frozen=True)
class AgentSettings(Message):
    """mini-swe-agent's `DefaultAgent` keyword arguments."""

    system_template: str
    instance_template: str
    step_limit: int
    cost_limit: float
    max_consecutive_format_errors: int
    wall_time_limit_seconds: int


@dataclass(frozen=True)
class MiniSweSpec(Message):
    """One episode: the task, the model behind the episode's gateway URL, the environment, the agent."""

    base_url: str  # the episode's OpenAI base URL on the gateway
    api_key: str
    task: str  # the row's instruction
    action_format: str  # "text" (LitellmTextbasedModel) or "tool_call" (LitellmModel)
    model_name: str  # litellm model name
    model_kwargs: dict[str, JsonValue]  # litellm kwargs of every call (temperature, max_tokens, extra_body, ...)
    environment: dict[str, JsonValue]  # mini-swe-agent environment config (`environment_class` and its kwargs)
    observation_template: str
    format_error_template: str  # "" = mini-swe-agent's own
    agent: AgentSettings


@dataclass(frozen=True)
class MiniSweOutcome(Message):
    """How the agent ended: its exit status and submission, model calls made, and the harness's error if any."""

    exit_status: str  # Submitted, LimitsExceeded, ... or the name of the exception that ended the run
    submission: str
    n_calls: int
    error: str | None = None  # "Type: message" when an exception ended the run
    traceback: str = ""
