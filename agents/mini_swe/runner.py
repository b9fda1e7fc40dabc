"""The harness side: mini-swe-agent's released classes, run unchanged for one episode in a process of its own.

Owns: `run_episode(spec)` — build `LitellmTextbasedModel` or `LitellmModel`, the configured environment
(`LocalEnvironment` by default) and `DefaultAgent` from a JSON-able spec, run the task, return
`{"exit_status", "submission", "n_calls", "error"}` — and `import_harness`, which the zygote
(`python -m fullasync_agents.mini_swe.runner`, i.e. `fullasync_agents.zygote.serve`) runs once so that
mini-swe-agent and litellm (about 4 s of CPU on this machine) are imported before it forks one episode
process per spec. Runs with the environment the generator gives the zygote (offline litellm,
mini-swe-agent's config dir). Does not own: the zygote, timeouts, scoring or the gateway.
"""

from __future__ import annotations

import traceback
from typing import Any

from fullasync_agents.zygote import serve


def import_harness() -> None:
    """Import what every episode uses, so forked episodes start warm."""
    import litellm  # noqa: F401
    import minisweagent.agents.default  # noqa: F401
    import minisweagent.environments  # noqa: F401
    import minisweagent.environments.local  # noqa: F401
    import minisweagent.models.litellm_model  # noqa: F401
    import minisweagent.models.litellm_textbased_model  # noqa: F401


def build_model(spec: dict[str, Any]):
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    model_class = LitellmTextbasedModel if spec["action_format"] == "text" else LitellmModel
    model_kwargs = {"api_base": spec["base_url"], "api_key": spec["api_key"], **spec["model_kwargs"]}
    extra = {key: spec[key] for key in ("observation_template", "format_error_template") if spec.get(key)}
    return model_class(model_name=spec["model_name"], model_kwargs=model_kwargs, cost_tracking="ignore_errors", **extra)


def build_environment(spec: dict[str, Any]):
    from minisweagent.environments import get_environment

    return get_environment(dict(spec["environment"]), default_type="local")


def run_episode(spec: dict[str, Any]) -> dict[str, Any]:
    """One mini-swe-agent episode; an exception of the harness is reported, not raised."""
    from minisweagent.agents.default import DefaultAgent

    agent = DefaultAgent(build_model(spec), build_environment(spec), **spec["agent"])
    try:
        outcome = agent.run(spec["task"])
    except Exception as error:  # DefaultAgent records the exit, then re-raises: report it to the launcher
        return {"exit_status": type(error).__name__, "submission": "", "n_calls": agent.n_calls,
                "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    return {"exit_status": outcome.get("exit_status", ""), "submission": outcome.get("submission", ""),
            "n_calls": agent.n_calls, "error": None}


if __name__ == "__main__":
    serve(import_harness, run_episode)
