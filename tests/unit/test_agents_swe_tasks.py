"""The toy SWE task sets are gated: on every task the visible test fails, doing nothing scores 0, and the oracle
command (run by bash, as an agent would) scores 1; the bugs' train/held-out split is by bug family, the settings
family's by name (held-out names are in no training row and no warm-up demonstration)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from process_waits import none_running

from fullasync_agents.sandbox import SandboxError, create_sandbox, score
from fullasync_agents.swe_tasks import HELD_OUT_FAMILIES, TRAIN_FAMILIES, held_out_rows, rows, setting_rows, train_rows
from fullasync_agents.swe_tasks.settings import WARMUP_NAMES

ROWS = rows()


def test_thirty_tasks_split_by_family_with_unique_ids():
    assert len(ROWS) == 30 and len({row["id"] for row in ROWS}) == 30
    assert {row["family"] for row in train_rows()} == set(TRAIN_FAMILIES)
    assert {row["family"] for row in held_out_rows()} == set(HELD_OUT_FAMILIES)
    assert len(train_rows()) == 20 and len(held_out_rows()) == 10
    assert rows() == ROWS  # deterministic


def test_hidden_tests_are_not_in_the_repository_the_agent_sees():
    for row in ROWS:
        assert not set(row["hidden_tests"]) & set(row["files"])
        assert "Hint:" in row["instruction"] and "Hint:" not in rows(hint=False)[ROWS.index(row)]["instruction"]


async def _gate(row, limit: asyncio.Semaphore) -> tuple[bool, float, float]:
    """(visible test fails on the bug, reward untouched, reward after the oracle command)."""
    async with limit:
        untouched, fixed = create_sandbox(row), create_sandbox(row)
        try:
            visible = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "unittest", "-q"],
                                              cwd=untouched.repo, capture_output=True)
            await asyncio.to_thread(subprocess.run, ["bash", "-c", row["oracle_command"]], cwd=fixed.repo, check=True)
            return visible.returncode != 0, await score(row, untouched), await score(row, fixed)
        finally:
            untouched.remove()
            fixed.remove()


async def test_every_task_fails_untouched_and_is_solved_by_its_oracle():
    limit = asyncio.Semaphore(4)
    results = await asyncio.gather(*(_gate(row, limit) for row in ROWS))
    assert [row["id"] for row, (visible_fails, _, _) in zip(ROWS, results) if not visible_fails] == []
    assert [row["id"] for row, (_, untouched, _) in zip(ROWS, results) if untouched != 0.0] == []
    assert [row["id"] for row, (_, _, fixed) in zip(ROWS, results) if fixed != 1.0] == []


async def test_a_hanging_test_suite_scores_zero_and_leaves_nothing(tmp_path):
    seconds = f"60.{time.time_ns() % 10**12:012d}"  # a command line no other process has
    row = {"id": "hang", "files": {"x.py": ""}, "test_command": ["sleep", seconds]}
    sandbox = create_sandbox(row, str(tmp_path))
    assert await score(row, sandbox, timeout_s=0.5) == 0.0
    assert await none_running(f"sleep {seconds}")


async def test_rows_without_a_repository_or_tests_say_what_is_missing():
    with pytest.raises(SandboxError, match="neither 'files' nor 'repo_dir'"):
        create_sandbox({"id": "empty"})
    sandbox = create_sandbox({"id": "no-tests", "files": {"a.py": ""}})
    try:
        with pytest.raises(SandboxError, match="no 'test_command'"):
            await score({"id": "no-tests"}, sandbox)
    finally:
        sandbox.remove()




SETTINGS = setting_rows()


def test_settings_family_holds_out_names_never_trained_on_or_demonstrated():
    train, held_out = setting_rows("train"), setting_rows("held_out")
    assert (len(train), len(held_out)) == (160, 40) and len({row["id"] for row in SETTINGS}) == 200
    train_names, held_names = {row["answer"] for row in train}, {row["answer"] for row in held_out}
    assert len(train_names) == 160 and len(held_names) == 40
    assert not (train_names | held_names) & set(WARMUP_NAMES) and not train_names & held_names
    for row, unhinted in zip(SETTINGS, setting_rows(hint=False), strict=True):
        assert f"\"{row['answer']}\"`" in row["instruction"] and row["answer"].isalpha() and row["answer"].islower()
        assert row["answer"] not in unhinted["instruction"] and unhinted["id"] == row["id"]
        assert row["answer"] not in "".join(row["files"][path] for path in row["files"] if path.startswith("app/"))
    assert setting_rows() == SETTINGS


async def test_settings_tasks_fail_untouched_and_are_solved_by_their_oracle():
    sample = SETTINGS[::10]  # 20 of 200, both splits; all are the same code with other names
    results = await asyncio.gather(*(_gate(row, asyncio.Semaphore(4)) for row in sample))
    assert [(visible_fails, untouched, fixed) for visible_fails, untouched, fixed in results] == [(True, 0.0, 1.0)] * 20


async def test_the_mini_swe_warm_ups_mistakes_score_zero():
    from examples.mini_swe.warmup import MISTAKES, fix_commands

    row = SETTINGS[-1]
    for mistake in (None, *MISTAKES):
        sandbox = create_sandbox(row)
        try:
            for command in fix_commands(row["answer"], mistake):
                await asyncio.to_thread(subprocess.run, ["bash", "-c", command], cwd=sandbox.repo, check=True)
            assert await score(row, sandbox) == (1.0 if mistake is None else 0.0), mistake
        finally:
            sandbox.remove()
