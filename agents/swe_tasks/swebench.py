"""SWE task rows in the formats users have (SWE-bench, SWE-Gym, R2E-Gym, SWE-smith), run in the row's container.

Owns: `swe_row(record)` — one record of those datasets (a jsonl/parquet line or a hub row, loaded through
`fullasync.data`) as a container task row: its id, the problem statement the agent sees, its image (named by the
record, or built from the `image_recipe` it names), the working directory (/testbed), the base commit, the test
patch and the FAIL_TO_PASS / PASS_TO_PASS tests — and `score_in_container`, the reward: the scorer's files (the test
patch's and those its test ids name) restored from the base commit, the agent's changes to them counted as tampering,
the test patch applied, the named tests run inside the episode's container under a scoring deadline
of their own; 1.0 when they all pass. Does not own: starting containers (`fullasync_agents.containers`) or the
agent.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fullasync.errors import InfraError
from fullasync_agents.containers import Container

WORKDIR = "/testbed"
IMAGE_FIELDS = ("image", "image_name", "docker_image")  # ours, SWE-smith / SWE-Gym, R2E-Gym
DEFAULT_TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider {tests}"
PODMAN_ERROR = 125  # `podman exec` (and `docker exec`) itself failed: the container, not the tests


def _tests(value: Any, field: str, row_id: str) -> list[str]:
    """SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON text; other sets as lists."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"row {row_id!r}: {field} is neither a list nor JSON text of one: "
                             f"{value[:80]!r}") from None
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"row {row_id!r}: {field} must list test ids (strings)")
    return list(value)


def swe_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """A container task row from a SWE-bench-style record; a clear ValueError naming the field when one is missing."""
    row_id = str(record.get("instance_id") or record.get("id") or "")
    if not row_id:
        raise ValueError(f"a SWE record needs `instance_id` (or `id`); its fields: {sorted(record)[:20]}")
    statement = record.get("problem_statement") or record.get("instruction")
    if not statement:
        raise ValueError(f"row {row_id!r} has no `problem_statement`: the agent would have no task")
    row: dict[str, Any] = {"id": row_id, "instruction": str(statement), "workdir": record.get("workdir", WORKDIR)}
    image = next((record[name] for name in IMAGE_FIELDS if record.get(name)), None)
    if image:
        row["image"] = str(image)
    elif isinstance(record.get("image_recipe"), Mapping):
        row["image_recipe"] = record["image_recipe"]
    else:
        raise ValueError(f"row {row_id!r} names no container image: give it one of {IMAGE_FIELDS} (built or pulled "
                         "where your podman/docker finds it) or an `image_recipe`")
    fail_to_pass = _tests(record.get("FAIL_TO_PASS", record.get("fail_to_pass")), "FAIL_TO_PASS", row_id)
    pass_to_pass = _tests(record.get("PASS_TO_PASS", record.get("pass_to_pass")), "PASS_TO_PASS", row_id)
    command = record.get("test_command") or record.get("test_cmd") or DEFAULT_TEST_COMMAND
    if not isinstance(command, str):
        command = shlex.join(command)
    if "{tests}" in command and not fail_to_pass:
        raise ValueError(f"row {row_id!r}: FAIL_TO_PASS is empty, so nothing shows the fix works; list the tests "
                         "the fix makes pass, or give a `test_command` that decides alone")
    row.update(base_commit=str(record.get("base_commit") or ""), test_patch=str(record.get("test_patch") or ""),
               fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, test_command=command)
    for name in ("repo", "split", "family"):
        if name in record:
            row[name] = record[name]
    return row


def patched_files(patch: str) -> list[str]:
    """The files a unified diff touches (its `diff --git a/X b/X` lines)."""
    return re.findall(r"^diff --git a/(\S+) b/", patch, flags=re.M)


@dataclass(frozen=True)
class SweScore:
    """A SWE episode's reward, and the scorer's files the agent had changed (restored before the tests ran)."""

    reward: float
    tampered: tuple[str, ...] = ()


def scorer_files(row: Mapping[str, Any]) -> list[str]:
    """The files the scorer relies on: those the test patch touches, and the files its test ids name
    (`tests/test_x.py::test_y`); ids without a path (`test_y (module.Class)`) name none."""
    tests = [*row.get("fail_to_pass", ()), *row.get("pass_to_pass", ())]
    named = [test.split("::", 1)[0] for test in tests if "::" in test or test.endswith(".py")]
    files = [*patched_files(str(row.get("test_patch") or "")), *named]
    return list(dict.fromkeys(name for name in files if name and not name.startswith(("/", "-"))))


async def restore_scorer_files(row: Mapping[str, Any], container: Container, timeout_s: float) -> tuple[str, ...]:
    """Put the scorer's files back as the base commit has them (a file the base lacks is removed, so the test
    patch creates it): the ones the agent changed, added or deleted, named. No base commit: nothing restored."""
    files, base = scorer_files(row), str(row.get("base_commit") or "")
    if not files or not base:
        return ()
    quoted, at = " ".join(shlex.quote(name) for name in files), shlex.quote(base)
    script = (f"changed=$( (git diff --name-only {at} -- {quoted}; git ls-files --others -- {quoted}) | sort -u); "
              f"for f in {quoted}; do if git cat-file -e {at}:\"$f\" 2>/dev/null; then "
              f"git checkout -q {at} -- \"$f\"; else rm -f -- \"$f\"; fi; done; printf '%s\\n' \"$changed\"")
    done = await container.exec(script, timeout_s)
    if done.timed_out:
        raise InfraError(f"container {container.id[:12]}: restoring the scorer's files timed out")
    _check(done.returncode, done.output, container, "restoring the scorer's files")
    return tuple(line for line in done.output.splitlines() if line.strip())


async def score_in_container(row: Mapping[str, Any], container: Container, timeout_s: float) -> SweScore:
    """Restore the scorer's files from the base commit, apply the test patch, run the row's tests in the container:
    1.0 if they pass, 0.0 if they fail, time out, or the patch no longer applies to what the agent left (SWE-bench's
    rule). InfraError when the container itself fails (it is not the policy's doing)."""
    tampered = await restore_scorer_files(row, container, timeout_s)
    patch = str(row.get("test_patch") or "")
    if patch:
        applied = await container.exec("git apply -", timeout_s, stdin=patch.encode())
        _check(applied.returncode, applied.output, container, "applying the test patch")
        if applied.returncode != 0:
            return SweScore(0.0, tampered)
    tests = " ".join(shlex.quote(test) for test in [*row.get("fail_to_pass", ()), *row.get("pass_to_pass", ())])
    done = await container.exec(str(row["test_command"]).replace("{tests}", tests), timeout_s)
    if done.timed_out:
        return SweScore(0.0, tampered)
    _check(done.returncode, done.output, container, "running the tests")
    return SweScore(1.0 if done.returncode == 0 else 0.0, tampered)


def _check(returncode: int, output: str, container: Container, what: str) -> None:
    if returncode == PODMAN_ERROR:
        raise InfraError(f"container {container.id[:12]} failed while {what}: {output.strip()[-500:]}")
