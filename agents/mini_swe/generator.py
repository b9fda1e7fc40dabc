"""`MiniSweAgentGenerator`: mini-swe-agent 2.4.6, unchanged, as a fullasync `CustomGenerator` over the gateway.

Owns: one episode end to end — a private sandbox (a copy of the row's repository), the spec that points
mini-swe-agent's own `DefaultAgent` + `LitellmTextbasedModel`/`LitellmModel` + environment at the
episode's gateway base URL, the run under a hard time limit (`HarnessLauncher`), the reward from the
row's hidden tests, and the split between outcomes and failures: every exit of the agent
(Submitted, LimitsExceeded, TimeExceeded, RepeatedFormatError, a context overflow) is scored by the
tests; a harness that crashes, errors or is killed at the time limit raises, so the rollouter counts
the episode as failed and never trains it as reward 0. The trajectory is what the gateway recorded.
Does not own: the gateway, recording, or the task rows (`fullasync_agents.swe_tasks`).

    generator = MiniSweAgentGenerator(MiniSweConfig(step_limit=4))
    AsyncAgentTrainer(config, rollout_fn=generator, train_dataset=train_rows(), val_dataset=held_out_rows()).train()
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from fullasync.rollout.generator import CustomGenerator, EpisodeContext

from fullasync_agents.mini_swe.config import MiniSweConfig
from fullasync_agents.mini_swe.launcher import HarnessLauncher
from fullasync_agents.sandbox import Sandbox, create_sandbox, score

# Harness exits that are the policy's doing and are scored like any other end state.
SCORED_ERRORS = frozenset({"ContextWindowExceededError"})


class HarnessError(RuntimeError):
    """mini-swe-agent failed for a reason that is not the policy's (gateway down, a bug, a crash)."""


def load_templates(path: str) -> dict[str, str]:
    """The prompt templates of a mini-swe-agent YAML config (e.g. the `mini.yaml` it ships)."""
    import yaml

    config = yaml.safe_load(Path(path).read_text())
    agent, model = config.get("agent", {}), config.get("model", {})
    found = {key: agent[key] for key in ("system_template", "instance_template") if key in agent}
    found.update({key: model[key] for key in ("observation_template", "format_error_template") if key in model})
    if not found:
        raise ValueError(f"templates_from={path!r} holds no agent.system_template / instance_template")
    return found


class MiniSweAgentGenerator(CustomGenerator):
    """mini-swe-agent on toy (or your) repositories; rows as in `fullasync_agents.swe_tasks.tasks`."""

    uses_gateway = True

    def __init__(self, config: MiniSweConfig | None = None) -> None:
        self.config = config if config is not None else MiniSweConfig()
        self.exit_statuses: Counter[str] = Counter()  # how episodes ended (scored ones and failures)
        self.model_calls: list[int] = []  # model calls of each finished (scored) episode
        self._templates: dict[str, str] = {}
        self._workdir: Path | None = None
        self._launcher: HarnessLauncher | None = None

    async def setup(self) -> None:
        """Start the harness process (mini-swe-agent and litellm imported once, offline)."""
        if self.config.templates_from:
            self._templates = load_templates(self.config.templates_from)
        self._workdir = Path(tempfile.mkdtemp(prefix="fullasync-mini-swe-"))
        self._launcher = HarnessLauncher(self._workdir, retries=self.config.model_retries)
        await self._launcher.start()

    async def teardown(self) -> None:
        if self._launcher is not None:
            await self._launcher.stop()
            self._launcher = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def model_kwargs(self, row: dict[str, Any]) -> dict[str, Any]:
        """litellm kwargs of every model call of this row's episode (override to constrain decoding, say)."""
        return {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
                **self.config.model_kwargs}

    def environment(self, sandbox: Sandbox) -> dict[str, Any]:
        """mini-swe-agent environment config; local: commands run in the sandbox's repository."""
        extra = {key: value.replace("{repo}", str(sandbox.repo)) if isinstance(value, str) else value
                 for key, value in self.config.environment.items()}
        if self.config.environment_class == "local":
            return {"environment_class": "local", "cwd": str(sandbox.repo), "timeout": self.config.command_timeout_s,
                    **extra}
        return {"environment_class": self.config.environment_class, "timeout": self.config.command_timeout_s, **extra}

    def episode_spec(self, episode: EpisodeContext, row: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        config = self.config
        return {
            "base_url": episode.base_url, "api_key": episode.api_key, "task": row["instruction"],
            "action_format": config.action_format, "model_name": config.model_name,
            "model_kwargs": self.model_kwargs(row), "environment": self.environment(sandbox),
            "observation_template": self._templates.get("observation_template", config.observation_template),
            "format_error_template": self._templates.get("format_error_template", ""),
            "agent": {
                "system_template": self._templates.get("system_template", config.resolved_system_template),
                "instance_template": self._templates.get("instance_template", config.instance_template),
                "step_limit": config.step_limit, "cost_limit": 0.0,
                "max_consecutive_format_errors": config.max_format_errors,
                "wall_time_limit_seconds": config.agent_wall_time_s,
            },
        }

    async def generate(self, episode: EpisodeContext, row: dict[str, Any]) -> float:
        if self._launcher is None:
            raise HarnessError("MiniSweAgentGenerator.setup() has not run: train through AsyncAgentTrainer / the "
                               "rollouter, or await generator.setup() first")
        if episode.base_url is None:
            raise HarnessError("the episode has no gateway base URL: keep uses_gateway = True")
        sandbox = create_sandbox(row, self.config.sandbox_parent or None)
        try:
            try:
                outcome = await self._launcher.run(self.episode_spec(episode, row, sandbox),
                                                   self.config.episode_timeout_s)
            except Exception as error:
                self.exit_statuses[type(error).__name__] += 1
                raise
            self.exit_statuses[outcome["exit_status"]] += 1
            if outcome["error"] and outcome["exit_status"] not in SCORED_ERRORS:
                raise HarnessError(f"mini-swe-agent failed on row {row.get('id')!r}: {outcome['error']}\n"
                                   f"{outcome.get('traceback', '')[-2000:]}")
            self.model_calls.append(outcome["n_calls"])
            return await score(row, sandbox, self.config.score_timeout_s)
        finally:
            sandbox.remove()
