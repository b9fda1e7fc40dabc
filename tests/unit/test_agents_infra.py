"""The harness adapters tell an infrastructure failure (the sandbox) from the row's or the harness's: an
`InfraError` runs the episode again, anything else fails it."""

from __future__ import annotations

import asyncio
import base64

import pytest

from fullasync.errors import InfraError
from fullasync_agents.containers import Containers, ContainerSettings
from fullasync_agents.sandbox import SandboxError, create_sandbox
from fullasync_agents.terminal_tasks import TASKS_DIR
from fullasync_agents.terminus.config import CONTAINER_ENVIRONMENT, STARTED_ENVIRONMENT, TerminusConfig
from fullasync_agents.terminus.generator import HarnessError, container_task, outcome_reward
from fullasync_agents.terminus.messages import TerminusOutcome


def test_a_sandbox_the_machine_cannot_make_is_an_infrastructure_failure(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(InfraError, match="no sandbox directory could be made"):
        create_sandbox({"id": "r", "files": {"a.py": ""}}, parent=str(not_a_folder))


def test_a_row_that_names_no_repository_is_the_rows_failure(tmp_path):
    with pytest.raises(SandboxError, match="neither 'files' nor 'repo_dir'"):
        create_sandbox({"id": "r"})
    with pytest.raises(SandboxError, match="is not a directory"):
        create_sandbox({"id": "r", "repo_dir": str(tmp_path / "absent")})


@pytest.mark.parametrize(("failure", "error"), [("EnvironmentStartTimeoutError", InfraError),
                                                ("SandboxBuildFailedError", InfraError),
                                                ("SandboxUnreachableError", InfraError),
                                                ("RuntimeError", HarnessError)])
def test_harbors_sandbox_failures_are_infrastructure_failures(failure, error):
    with pytest.raises(error):
        outcome_reward(TerminusOutcome(exception_type=failure, exception_message="boom"), "row-1")
    assert outcome_reward(TerminusOutcome(exception_type="VerifierTimeoutError"), "row-1") == 0.0


def test_terminus_in_containers_gets_harbors_podman_environment_with_our_overlay_settings():
    config = TerminusConfig(environment_type="container", container=ContainerSettings(memory="1g", max_starting=2))
    entry = config.environment_entry("/episode", {"fullasync.episode": "e1"}, "/slots")
    assert entry["import_path"] == CONTAINER_ENVIRONMENT and entry["delete"] is False  # the task image is kept
    assert entry["kwargs"]["container"]["memory"] == "1g" and entry["kwargs"]["container"]["max_starting"] == 2
    assert entry["kwargs"]["labels"] == {"fullasync.episode": "e1"} and entry["kwargs"]["slots_dir"] == "/slots"
    assert TerminusConfig().environment_entry("/episode")["kwargs"]["sandbox_parent"] == "/episode"


def test_summarisation_is_harbors_default_and_its_threshold_must_fit_the_context():
    kwargs = TerminusConfig().agent_kwargs_for("http://127.0.0.1:1/v1", "key", {})
    assert kwargs["enable_summarize"] is True and kwargs["proactive_summarization_threshold"] == 0
    off = TerminusConfig(summarize=False, summarize_below_free_tokens=500).agent_kwargs_for("u", "k", {})
    assert off["enable_summarize"] is False and off["proactive_summarization_threshold"] == 500
    with pytest.raises(ValueError, match="summarize_below_free_tokens=8000 must be in"):
        TerminusConfig(context_length=4096, summarize_below_free_tokens=8000)


def test_terminus_on_the_ray_nodes_reaches_the_container_a_nodes_service_started():
    cluster = ContainerSettings(placement="cluster")
    with pytest.raises(ValueError, match="set environment_type=container"):
        TerminusConfig(container=cluster)  # the local namespace sandbox starts no container to place
    entry = TerminusConfig(environment_type="container", container=cluster).environment_entry(
        "/episode", started_container=("c0ffee", "/tmp/fa-relay-x/podman"))
    assert entry["import_path"] == STARTED_ENVIRONMENT and entry["delete"] is False
    assert entry["kwargs"] == {"container_id": "c0ffee", "executable": "/tmp/fa-relay-x/podman"}


def test_a_harbor_task_as_a_container_task_sends_its_build_context(tmp_path):
    task = container_task(TASKS_DIR / "copy-file")
    assert task["id"] == "copy-file" and task["workdir"] == "/app"  # task.toml's
    context = {name: base64.b64decode(content) for name, content in task["image_recipe"]["context"].items()}
    assert set(context) == {"Dockerfile", "app/config/settings.ini"}
    assert context["Dockerfile"] == (TASKS_DIR / "copy-file/environment/Dockerfile").read_bytes()
    named = tmp_path / "named"
    (named / "environment").mkdir(parents=True)
    (named / "task.toml").write_text('[environment]\ndocker_image = "localhost/mine:1"\n')
    (named / "environment/Dockerfile").write_text("FROM scratch\nWORKDIR /work\n")
    assert container_task(named) == {"id": "named", "workdir": "/work", "image": "localhost/mine:1"}
    (named / "environment/docker-compose.yaml").write_text("services: {}\n")
    assert container_task(named) is None  # several services: harbor's own podman environment runs it


def test_a_build_context_naming_a_file_outside_it_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="outside its build context"):
        asyncio.run(Containers()._build_context("localhost/t:1", {"../../etc/cron.d/x": ""}))

