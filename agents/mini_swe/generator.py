"""`MiniSweAgentGenerator`: mini-swe-agent 2.4.6, unchanged, as a fullasync `CustomGenerator` over the gateway.

Owns: one episode end to end — a private sandbox (a copy of the row's repository), the spec that points
mini-swe-agent's own `DefaultAgent` + `LitellmTextbasedModel`/`LitellmModel` + environment at the
episode's gateway base URL, the run under a hard time limit (`ZygoteLauncher`), the reward from the
row's hidden tests, and the split between outcomes and failures: every exit of the agent
(Submitted, LimitsExceeded, TimeExceeded, RepeatedFormatError, a context overflow) is scored by the
tests; a harness that crashes, errors or is killed at the time limit raises, so the rollouter counts
the episode as failed and never trains it as reward 0. The trajectory is what the gateway recorded.
Does not own: the gateway, recording, or the task rows (`fullasync_agents.swe_tasks`).

    generator = MiniSweAgentGenerator(MiniSweConfig(step_limit=4))
    AsyncAgentTrainer(config, rollout_fn=generator, train_dataset=train_rows(), val_dataset=held_out_rows()).train()
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from fullasync.observe.metrics import TAMPERED
from fullasync.rollout.generator import EpisodeContext
from fullasync.types import JsonValue
from fullasync_agents import harness_generator
from fullasync_agents.harness_generator import HarnessGenerator
from fullasync_agents.mini_swe.config import MiniSweConfig
from fullasync_agents.mini_swe.messages import AgentSettings, MiniSweOutcome, MiniSweSpec
from fullasync_agents.sandbox import create_sandbox, score
from fullasync_agents.sandboxes import Sandboxes, sandboxes_for
from fullasync_agents.swe_tasks.swebench import WORKDIR, swe_row

CONTAINER = "container"  # `environment_class`: the row's container, started and scored here
ATTACHED = "fullasync_agents.mini_swe.environment.AttachedContainerEnvironment"
# Harness exits that are the policy's doing and are scored like any other end state.
SCORED_ERRORS = frozenset({"ContextWindowExceededError"})


MISSING_HINT = "is the `agents` extra installed: pip install -e '.[agents]'?"


class HarnessError(harness_generator.HarnessError):
    """mini-swe-agent failed for a reason that is not the policy's (gateway down, a bug, a crash)."""


def offline_environment(config_dir: Path, retries: int) -> dict[str, str]:
    """The zygote's environment: mini-swe-agent quiet and configured from `config_dir`, litellm off the network."""
    env = dict(os.environ)
    env.update({
        "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir),
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(retries),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    return env


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


class MiniSweAgentGenerator(HarnessGenerator):
    """mini-swe-agent on toy (or your) repositories; rows as in `fullasync_agents.swe_tasks.tasks`."""

    harness_error = HarnessError

    def __init__(self, config: MiniSweConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else MiniSweConfig()
        self.model_calls: list[int] = []  # model calls of each finished (scored) episode
        # episode containers (environment_class=container), here or on the Ray nodes (container.placement)
        self.sandboxes: Sandboxes = sandboxes_for(self.config.container)
        self._templates: dict[str, str] = {}

    async def setup(self) -> None:
        """Start the harness process (mini-swe-agent and litellm imported once, offline); with containers, first
        say in one line what would stop them (the CLI, free disk under its store)."""
        if self.config.environment_class == CONTAINER:
            await self.preflight_containers()
        if self.config.templates_from:
            self._templates = load_templates(self.config.templates_from)
        config_dir = self.new_workdir("fullasync-mini-swe-") / "mswea-config"
        config_dir.mkdir()
        await self.start_harness([sys.executable, "-m", "fullasync_agents.mini_swe.runner"],
                                 offline_environment(config_dir, self.config.model_retries),
                                 harness="mini-swe-agent", missing_hint=MISSING_HINT)

    def container_task(self, row: dict[str, Any]) -> dict[str, Any] | None:
        return self._task(row) if self.config.environment_class == CONTAINER else None

    @staticmethod
    def _task(row: dict[str, Any]) -> dict[str, Any]:
        """The row as a container task (a SWE-bench-style record, `swe_row`), its working directory named."""
        task = swe_row(row) if "instance_id" in row else row
        return {**task, "workdir": str(task.get("workdir", WORKDIR))}

    def model_kwargs(self, row: dict[str, Any]) -> dict[str, JsonValue]:
        """litellm kwargs of every model call of this row's episode (override to constrain decoding, say)."""
        return {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
                **self.config.model_kwargs}

    def environment(self, workdir: str, **container: JsonValue) -> dict[str, JsonValue]:
        """mini-swe-agent environment config: commands run in `workdir`, on the host (local) or in the episode's
        container (`container`: its id and executable)."""
        extra = {key: value.replace("{repo}", workdir) if isinstance(value, str) else value
                 for key, value in self.config.environment.items()}
        kind = self.config.environment_class
        if kind == "local":
            return {"environment_class": "local", "cwd": workdir, "timeout": self.config.command_timeout_s, **extra}
        if kind == CONTAINER:
            return {"environment_class": ATTACHED, "cwd": workdir, "timeout": self.config.command_timeout_s,
                    "image": "attached", **container, **extra}
        return {"environment_class": kind, "timeout": self.config.command_timeout_s, **extra}

    def episode_spec(self, episode: EpisodeContext, row: dict[str, Any],
                     environment: dict[str, JsonValue]) -> MiniSweSpec:
        config = self.config
        base_url, api_key = self.gateway(episode)
        return MiniSweSpec(
            base_url=base_url, api_key=api_key, task=row["instruction"],
            action_format=config.action_format, model_name=config.model_name,
            model_kwargs=self.model_kwargs(row), environment=environment,
            observation_template=self._templates.get("observation_template", config.observation_template),
            format_error_template=self._templates.get("format_error_template", ""),
            agent=AgentSettings(
                system_template=self._templates.get("system_template", config.resolved_system_template),
                instance_template=self._templates.get("instance_template", config.instance_template),
                step_limit=config.step_limit, cost_limit=0.0,
                max_consecutive_format_errors=config.max_format_errors,
                wall_time_limit_seconds=config.agent_wall_time_s,
            ),
        )

    async def generate(self, episode: EpisodeContext, row: dict[str, Any]) -> float:
        self.launcher_for(episode, "MiniSweAgentGenerator")
        if self.config.environment_class == CONTAINER:
            return await self._in_container(episode, row)
        sandbox = create_sandbox(row, self.config.sandbox_parent or None)
        try:
            await self._run_agent(episode, row, self.environment(str(sandbox.repo)))
            return await score(row, sandbox, self.config.score_timeout_s)
        finally:
            sandbox.remove()

    async def _in_container(self, episode: EpisodeContext, row: dict[str, Any]) -> float:
        """The episode in the row's container (a SWE-bench-style record, `swe_row`): the agent's commands and then
        the row's tests run in it, under deadlines of their own; the container is removed (or reset for reuse) whatever
        happens."""
        sandbox = await self.sandboxes.start(self._task(row), episode.episode_id)
        environment = self.environment(sandbox.workdir, container_id=sandbox.id, executable=sandbox.executable)
        try:
            await self._run_agent(episode, {**row, **sandbox.task}, environment)  # the row's fields for `model_kwargs`
            scored = await self.sandboxes.score(sandbox, self.config.score_timeout_s)
        finally:
            await self.sandboxes.finish(sandbox)  # removed, or reset for the next episode of its image
        episode.client.log(TAMPERED, float(bool(scored.tampered)))  # reward/tampered: the step's count
        return scored.reward

    async def _run_agent(self, episode: EpisodeContext, row: dict[str, Any],
                         environment: dict[str, JsonValue]) -> MiniSweOutcome:
        """mini-swe-agent on `row` under the episode's hard time limit; the harness's own failure raises."""
        outcome = await self.run_harness(self.episode_spec(episode, row, environment), MiniSweOutcome,
                                         self.config.episode_timeout_s)
        self.exit_statuses[outcome.exit_status] += 1
        self.log(episode, f"exit/{outcome.exit_status}", 1)  # per step: how many episodes ended so
        if outcome.error and outcome.exit_status not in SCORED_ERRORS:
            raise HarnessError(f"mini-swe-agent failed on row {row.get('id')!r}: {outcome.error}\n"
                               f"{outcome.traceback[-2000:]}")
        self.model_calls.append(outcome.n_calls)
        self.log(episode, "model_calls", outcome.n_calls)
        return outcome
