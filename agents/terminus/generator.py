"""`Terminus2Generator`: harbor's Terminus-2 (harbor 0.24.0, unchanged) as a `CustomGenerator` over the gateway.

Owns: one episode end to end — the spec that points harbor's own `Trial` (task directory, agent
`terminus-2`, environment, verifier) at the episode's gateway base URL and key, the run in the harbor
interpreter under a hard time limit (`ZygoteLauncher`: the episode's process and everything below it,
sandbox included, are killed at `episode_timeout_s`), the reward from the task's `tests/test.sh`
(harbor's verifier), and the split between outcomes and failures: every end of the agent (done,
`max_turns` reached, harbor's agent timeout) is scored by the verifier; a context overflow or a test
that hangs past the verifier timeout scores 0 (harbor skips or cuts the verification; the policy
caused it); anything else — the harness crashing, the sandbox not starting, a task without a
reward, the hard kill — raises, so the rollouter counts the episode as failed and never trains it
as reward 0. The trajectory is what the gateway recorded. Does not own: the gateway, recording, the
task rows (`fullasync_agents.terminal_tasks`) or the sandbox (`sandbox_environment`). With
`environment_type="container"` the episode's container is started here before the trial, through
`fullasync_agents.sandboxes` — on this host or (`container.placement=cluster`) by the sandbox service of the Ray node
with the most free places: the task's image built from its `environment/` (sent with the request), its repository
cut at its base, the budgets, the warm pool — harbor reaching it with `started_environment`, and removed (or reset)
here when the episode ends. A docker-compose task (several services) runs in harbor's own podman environment with our
overlay instead (`container_environment`, this host only; here the harness's PATH and the removal of its container).

    generator = Terminus2Generator(TerminusConfig(max_turns=4))
    AsyncAgentTrainer(config, rollout_fn=generator, train_dataset=train_rows(), val_dataset=held_out_rows()).train()
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

from fullasync.errors import InfraError
from fullasync.rollout.generator import EpisodeContext
from fullasync.types import JsonValue
from fullasync_agents import containers, harness_generator
from fullasync_agents.harness_generator import HarnessGenerator
from fullasync_agents.sandboxes import Sandbox, sandboxes_for
from fullasync_agents.terminus import interpreter
from fullasync_agents.terminus.config import TerminusConfig
from fullasync_agents.terminus.messages import TerminusOutcome, TerminusSpec

# Harness exits that are the policy's doing and score 0 without (complete) verification.
SCORED_ZERO = frozenset({"ContextLengthExceededError", "VerifierTimeoutError"})
# Trial failures of the sandbox, not of the harness or the policy: the episode is run again (fullasync's `infra`).
INFRA_FAILURES = frozenset({"EnvironmentStartTimeoutError", "AgentSetupTimeoutError", "HealthcheckError",
                            "SandboxBuildFailedError", "SandboxUnreachableError"})


class HarnessError(harness_generator.HarnessError):
    """Terminus-2 or its trial failed for a reason that is not the policy's (set-up, sandbox, task, a crash)."""


def outcome_reward(outcome: TerminusOutcome, row_id: object) -> float:
    """The episode's reward from harbor's trial result; InfraError when the sandbox failed (the episode runs
    again), HarnessError when another failure is not the policy's."""
    failure = outcome.exception_type
    if outcome.reward is not None:
        return outcome.reward
    if failure in SCORED_ZERO:
        return 0.0
    if failure is None:
        raise HarnessError(f"row {row_id!r}: the verifier gave no 'reward' (rewards {outcome.rewards}): "
                           "the task's tests/test.sh must write /logs/verifier/reward.txt")
    if failure in INFRA_FAILURES:
        raise InfraError(f"row {row_id!r}: harbor's sandbox failed ({failure}: {outcome.exception_message})")
    raise HarnessError(f"Terminus-2's trial failed on row {row_id!r}: {failure}: {outcome.exception_message}\n"
                       f"{(outcome.traceback or '')[-2000:]}")


def container_task(task_dir: str | Path) -> dict[str, Any] | None:
    """A harbor task as a container task (`fullasync_agents.sandboxes`): its image named by task.toml's
    `environment.docker_image`, or built from `environment/` (each file sent, base64); its workdir. None for a
    docker-compose task (several services: harbor's own podman environment runs it)."""
    root = Path(task_dir)
    environment = tomllib.loads((root / "task.toml").read_text()).get("environment", {})
    context = root / "environment"
    if (context / "docker-compose.yaml").exists():  # the one name harbor reads
        return None
    dockerfile = context / "Dockerfile"
    workdir = environment.get("workdir") or ""
    if not workdir and dockerfile.is_file():
        named = re.findall(r"(?im)^\s*WORKDIR\s+(\S+)", dockerfile.read_text())
        workdir = named[-1] if named else ""
    task: dict[str, Any] = {"id": root.name, "workdir": workdir or "/"}
    if environment.get("docker_image"):
        return {**task, "image": str(environment["docker_image"])}
    if not dockerfile.is_file():
        raise HarnessError(f"task {root.name}: neither environment.docker_image in task.toml nor "
                           f"{dockerfile} names its image")
    files = {str(path.relative_to(context)): base64.b64encode(path.read_bytes()).decode()
             for path in sorted(context.rglob("*")) if path.is_file()}
    return {**task, "image_recipe": {"context": files}}


class Terminus2Generator(HarnessGenerator):
    """Terminus-2 on harbor-format terminal tasks; rows as in `fullasync_agents.terminal_tasks`."""

    harness_error = HarnessError
    harbor_agent = "terminus-2"  # harbor's agent name (the tests' gate runs harbor's `oracle` and `nop` the same way)

    def __init__(self, config: TerminusConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else TerminusConfig()
        self.turns: list[int] = []  # agent turns of each finished (scored) episode
        self.last_outcome: TerminusOutcome | None = None  # harbor's report of the latest scored episode
        self.containers: containers.Containers | None = None  # compose tasks' containers: removes what is left
        self._slots_dir = ""
        self._tasks: dict[str, dict[str, Any] | None] = {}  # each task directory as a container task

    async def setup(self) -> None:
        """Start the harness process in the harbor interpreter (harbor, Terminus-2 and litellm imported once);
        with task containers, say in one line what would stop them, check podman-compose (this host's compose tasks)
        and remove what a killed run left."""
        python = interpreter.harbor_python(self.config.harbor_python)
        interpreter.check_harbor(python)
        workdir = self.new_workdir("fullasync-terminus-")
        paths = interpreter.import_path(workdir / "pythonpath")
        env = interpreter.harness_environment(paths)
        if self.config.environment_type == "container":
            self.sandboxes = sandboxes_for(self.config.container)
            await self.preflight_containers()
            if self.config.container.placement == "local":
                env.update(await self._container_setup(python, workdir))
        await self.start_harness([str(python), "-m", "fullasync_agents.terminus.runner"], env, harness="Terminus-2",
                                 missing_hint=interpreter.SETUP_HINT)

    async def _container_setup(self, python: Path, workdir: Path) -> dict[str, str]:
        """The harness's environment for harbor's podman environment, which runs compose tasks (podman-compose on
        PATH, builds isolated without a bridge), after sweeping the containers of dead runs."""
        compose = python.parent / "podman-compose"
        if shutil.which(self.config.container.executable) is None or not compose.exists():
            raise HarnessError(f"environment_type=container needs {self.config.container.executable} "
                               f"({containers.SETUP_HINT}) and podman-compose beside {python} (make setup-terminus)")
        self.containers = containers.Containers(self.config.container)
        await self.containers.sweep()
        self._slots_dir = str(workdir / "start-slots")
        return {"PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}", "BUILDAH_ISOLATION": "chroot"}

    def container_task(self, row: dict[str, Any]) -> dict[str, Any] | None:
        if self.sandboxes is None or not row.get("task_dir"):
            return None
        task_dir = str(row["task_dir"])
        if task_dir not in self._tasks:
            self._tasks[task_dir] = container_task(task_dir)
        return self._tasks[task_dir]

    def llm_call_kwargs(self, row: dict[str, Any]) -> dict[str, JsonValue]:
        """Extra kwargs of every model call of this row's episode (override to constrain decoding, say)."""
        return dict(self.config.llm_call_kwargs)

    def agent_entry(self, episode: EpisodeContext, row: dict[str, Any]) -> dict[str, JsonValue]:
        """harbor's `AgentConfig` fields for this episode."""
        base_url, api_key = self.gateway(episode)
        kwargs = self.config.agent_kwargs_for(base_url, api_key, self.llm_call_kwargs(row))
        return {"name": self.harbor_agent, "model_name": self.config.model_name, "kwargs": kwargs}

    def episode_spec(self, episode: EpisodeContext, row: dict[str, Any], files: Path,
                     sandbox: Sandbox | None = None) -> TerminusSpec:
        config = self.config
        verifier: dict[str, JsonValue] = {"override_timeout_sec": config.verifier_timeout_s} \
            if config.verifier_timeout_s else {}
        agent = self.agent_entry(episode, row)
        if config.agent_timeout_s:
            agent["override_timeout_sec"] = config.agent_timeout_s
        return TerminusSpec(
            task_dir=str(row["task_dir"]), trials_dir=str(files / "trials"), trial_name="trial",
            agent=agent, verifier=verifier,
            environment=config.environment_entry(str(files), self.container_labels(episode), self._slots_dir,
                                                 (sandbox.id, sandbox.executable) if sandbox is not None else None),
            extra_instructions=[str(line) for line in row.get("extra_instructions", [])],
        )

    @staticmethod
    def container_labels(episode: EpisodeContext) -> dict[str, str]:
        """The labels of the episode's task container: ours, whose process started it, which episode."""
        return {containers.MANAGED: "1", containers.OWNER: containers.owner(), containers.EPISODE: episode.episode_id}

    async def generate(self, episode: EpisodeContext, row: dict[str, Any]) -> float:
        launcher = self.launcher_for(episode, "Terminus2Generator")
        if not row.get("task_dir") or not (Path(row["task_dir"]) / "task.toml").is_file():
            raise HarnessError(f"row {row.get('id')!r}: 'task_dir' must name a harbor task directory (with task.toml), "
                               f"got {row.get('task_dir')!r}")
        files = launcher.episode_dir()
        task = self.container_task(row)
        if self.sandboxes is not None and task is None and self.config.container.placement == "cluster":
            raise HarnessError(f"row {row.get('id')!r}: a docker-compose task (several services) is not placed on "
                               "the Ray nodes; run it with container.placement=local")
        sandbox = await self.sandboxes.start(task, episode.episode_id) if self.sandboxes and task else None
        try:
            outcome = await self.run_harness(self.episode_spec(episode, row, files, sandbox), TerminusOutcome,
                                             self.config.episode_timeout_s, files)
        finally:
            if sandbox is not None and self.sandboxes is not None:  # removed (or reset for the next episode)
                await self.sandboxes.finish(sandbox)
            if self.containers is not None:  # harbor removes its container; a hard kill leaves it to us
                await self.containers.remove_episode(episode.episode_id)
        status = outcome.exception_type or "Verified"
        self.exit_statuses[status] += 1
        self.log(episode, f"exit/{status}", 1)  # per step: how many episodes ended so
        if status == "ContextLengthExceededError" and episode.client is not None and not episode.client.episode.calls:
            raise HarnessError(f"row {row.get('id')!r}: Terminus-2's first prompt does not fit the policy's context "
                               "(harbor's prompt alone is ~1,600 tokens of the tiny tokenizer): raise "
                               "engine.max_model_len and TerminusConfig.context_length")
        reward = outcome_reward(outcome, row.get("id"))
        self.turns.append(outcome.n_turns or 0)
        self.log(episode, "turns", outcome.n_turns or 0)
        self.last_outcome = outcome
        return reward
