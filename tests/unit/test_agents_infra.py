"""The harness adapters tell an infrastructure failure (the sandbox) from the row's or the harness's: an
`InfraError` runs the episode again, anything else fails it."""

from __future__ import annotations

import pytest

from fullasync.errors import InfraError
from fullasync_agents.containers import ContainerSettings
from fullasync_agents.sandbox import SandboxError, create_sandbox
from fullasync_agents.terminus.config import CONTAINER_ENVIRONMENT, TerminusConfig
from fullasync_agents.terminus.generator import HarnessError, outcome_reward
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
