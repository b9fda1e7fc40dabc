"""The harness side: mini-swe-agent's released classes, run unchanged for one episode in a process of its own.

Owns: `run_episode(spec)` — build `LitellmTextbasedModel` or `LitellmModel`, the configured environment
(`LocalEnvironment` by default) and `DefaultAgent` from a `MiniSweSpec`, run the task, return a
`MiniSweOutcome` — and `import_harness`, which the zygote
(`python -m fullasync_agents.mini_swe.runner`, i.e. `fullasync_agents.zygote.serve`) runs once so that
mini-swe-agent and litellm (about 4 s of CPU on this machine) are imported before it forks one episode
process per spec. Runs with the environment the generator gives the zygote (offline litellm,
mini-swe-agent's config dir). Does not own: the zygote, timeouts, scoring or the gateway.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

from fullasync_agents.mini_swe.messages import MiniSweOutcome, MiniSweSpec
from fullasync_agents.zygote import serve

if TYPE_CHECKING:
    from minisweagent import Environment, Model


def import_harness() -> None:
    """Import what every episode uses, so forked episodes start warm."""
    import litellm  # noqa: F401
    import minisweagent.agents.default
    import minisweagent.environments
    import minisweagent.environments.local
    import minisweagent.models.litellm_model
    import minisweagent.models.litellm_textbased_model  # noqa: F401


def build_model(spec: MiniSweSpec) -> Model:
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    model_class = LitellmTextbasedModel if spec.action_format == "text" else LitellmModel
    model_kwargs = {"api_base": spec.base_url, "api_key": spec.api_key, **spec.model_kwargs}
    templates = {"observation_template": spec.observation_template, "format_error_template": spec.format_error_template}
    # "": mini-swe-agent's own; Any, or the type checker matches `**extra` to the models' `config_class` parameter
    extra: dict[str, Any] = {key: template for key, template in templates.items() if template}
    return model_class(model_name=spec.model_name, model_kwargs=model_kwargs, cost_tracking="ignore_errors", **extra)


def build_environment(spec: MiniSweSpec) -> Environment:
    from minisweagent.environments import get_environment

    return get_environment(dict(spec.environment), default_type="local")


def run_episode(spec: MiniSweSpec) -> MiniSweOutcome:
    """One mini-swe-agent episode; an exception of the harness is reported, not raised."""
    from minisweagent.agents.default import DefaultAgent

    settings = spec.agent
    agent = DefaultAgent(build_model(spec), build_environment(spec), system_template=settings.system_template,
                         instance_template=settings.instance_template, step_limit=settings.step_limit,
                         cost_limit=settings.cost_limit,
                         max_consecutive_format_errors=settings.max_consecutive_format_errors,
                         wall_time_limit_seconds=settings.wall_time_limit_seconds)
    try:
        outcome = agent.run(spec.task)
    except Exception as error:  # DefaultAgent records the exit, then re-raises: report it to the launcher
        return MiniSweOutcome(exit_status=type(error).__name__, submission="", n_calls=agent.n_calls,
                              error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc())
    return MiniSweOutcome(exit_status=outcome.get("exit_status", ""), submission=outcome.get("submission", ""),
                          n_calls=agent.n_calls)


if __name__ == "__main__":
    serve(import_harness, run_episode, MiniSweSpec)
