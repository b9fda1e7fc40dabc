"""The harness adapters tell an infrastructure failure (the sandbox) from the row's or the harness's: an
`InfraError` runs the episode again, anything else fails it."""

from __future__ import annotations

import pytest

from fullasync.errors import InfraError
from fullasync_agents.sandbox import SandboxError, create_sandbox
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
