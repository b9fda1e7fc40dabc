"""The harness side: harbor's released `Trial` running Terminus-2 unchanged, one trial per forked process.

Runs under the harbor interpreter (Python >= 3.12, `make setup-terminus`) as
`python -m fullasync_agents.terminus.runner`, with `fullasync_agents` and `fullasync` on its path
(stdlib-only modules of them are used here). Owns: `run_episode(spec)` — build harbor's
`TrialConfig` (task directory, agent `terminus-2` or any harbor agent such as `oracle`/`nop`,
environment by import path or type, verifier, extra instructions) from a `TerminusSpec`, run the
trial, and report it as a `TerminusOutcome` (reward, the exception that ended the trial, turns,
messages, rollout details). The zygote around it is `fullasync_agents.zygote.serve`.
Does not own: timeouts, scoring policy (which harbor exits count as rewards) or the gateway.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fullasync_agents.terminus.messages import TerminusOutcome, TerminusSpec
from fullasync_agents.zygote import serve

if TYPE_CHECKING:
    from harbor.models.trial.config import TrialConfig


def import_harness() -> None:
    """Import what every trial uses, so forked episodes start warm."""
    import harbor.agents.nop
    import harbor.agents.oracle
    import harbor.agents.terminus_2.terminus_2
    import harbor.trial.single_step
    import harbor.trial.trial  # noqa: F401
    import litellm  # noqa: F401

    import fullasync_agents.terminus.sandbox_environment  # noqa: F401


def trial_config(spec: TerminusSpec) -> TrialConfig:
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig

    return TrialConfig(
        task=TaskConfig(path=spec.task_dir), trials_dir=spec.trials_dir, trial_name=spec.trial_name,
        agent=AgentConfig(**spec.agent), environment=EnvironmentConfig(**spec.environment),
        verifier=VerifierConfig(**spec.verifier), extra_instructions=spec.extra_instructions,
    )


async def run_trial(spec: TerminusSpec) -> TerminusOutcome:
    from harbor.trial.trial import Trial

    trial = await Trial.create(trial_config(spec))
    result = await trial.run()
    verified = result.verifier_result
    failure = result.exception_info
    agent = result.agent_result
    metadata = (agent.metadata if agent is not None else None) or {}
    return TerminusOutcome(
        reward=(verified.rewards or {}).get("reward") if verified is not None else None,
        rewards=(verified.rewards or {}) if verified is not None else None,
        exception_type=failure.exception_type if failure is not None else None,
        exception_message=failure.exception_message if failure is not None else None,
        traceback=failure.exception_traceback if failure is not None else None,
        n_turns=metadata.get("n_episodes"),
        messages=metadata.get("all_messages"),
        rollout_details=(agent.rollout_details if agent is not None else None) or [],
    )


def run_episode(spec: TerminusSpec) -> TerminusOutcome:
    return asyncio.run(run_trial(spec))


if __name__ == "__main__":
    serve(import_harness, run_episode, TerminusSpec)
