"""What crosses the zygote boundary for Terminus-2: one trial's spec in, harbor's trial result back.

Owns: `TerminusSpec` (made by `Terminus2Generator.episode_spec`, read by `runner.run_episode`) and
`TerminusOutcome` (made by `runner.run_trial`, read by the generator), both checked on receipt
(`fullasync_agents.messages`). Stdlib only: it loads in harbor's interpreter (Python >= 3.12).
Does not own: harbor's configuration models (`TrialConfig` and its parts); their fields travel as JSON objects
and harbor checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fullasync.types import JsonValue
from fullasync_agents.messages import Message


@dataclass(frozen=True)
class TerminusSpec(Message):
    """One harbor trial: the task directory, where the trial writes, and harbor's agent/environment/verifier."""

    task_dir: str
    trials_dir: str
    trial_name: str
    agent: dict[str, JsonValue]  # harbor `AgentConfig` fields (name, model_name, kwargs, override_timeout_sec)
    environment: dict[str, JsonValue]  # harbor `EnvironmentConfig` fields
    verifier: dict[str, JsonValue] = field(default_factory=dict)  # harbor `VerifierConfig` fields
    extra_instructions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TerminusOutcome(Message):
    """harbor's trial result: the verifier's reward, the exception that ended the trial (if any), the agent's record."""

    reward: float | None = None  # the verifier's "reward" (None: no verification)
    rewards: dict[str, float] | None = None  # every reward the verifier wrote
    exception_type: str | None = None
    exception_message: str | None = None
    traceback: str | None = None
    n_turns: int | None = None  # the agent's turns (harbor's `n_episodes`)
    messages: list[JsonValue] | None = None  # the chat as the agent kept it
    rollout_details: list[JsonValue] = field(default_factory=list)  # token ids harbor recorded through litellm
