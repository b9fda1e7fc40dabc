"""The terminal task set is gated through harbor's own code: in the local namespace sandbox, harbor's oracle agent
(the task's solve.sh) scores 1 and its no-op agent 0 on every task; the sandbox keeps the host read-only, has no
network, and leaves no process behind. No model is involved (harbor's oracle and nop agents make no calls)."""

from __future__ import annotations

import asyncio
import os
import stat
import time
import tomllib
from pathlib import Path

import pytest
from process_waits import none_running

from fullasync.rollout.generator import EpisodeContext
from fullasync_agents.terminal_tasks import (
    HELD_OUT_FAMILIES,
    TASKS_DIR,
    TRAIN_FAMILIES,
    held_out_rows,
    rows,
    train_rows,
)
from fullasync_agents.terminus import HarborMissingError, HarnessError, Terminus2Generator, TerminusConfig

ROWS = rows()
NO_GATEWAY = EpisodeContext("gate", client=None, base_url="http://127.0.0.1:9/v1", api_key="unused")


class HarborAgents(Terminus2Generator):
    """The adapter unchanged, except that a row names which of harbor's own agents runs instead of Terminus-2."""

    def agent_entry(self, episode, row):
        return {"name": row["harbor_agent"]}


@pytest.fixture(scope="module")
async def harbor_agents():
    generator = HarborAgents(TerminusConfig(episode_timeout_s=120.0))
    await generator.setup()
    yield generator
    await generator.teardown()


def test_twenty_tasks_in_harbor_format_split_by_family():
    assert len(ROWS) == 20 and len({row["id"] for row in ROWS}) == 20
    assert {row["family"] for row in train_rows()} == set(TRAIN_FAMILIES) and len(train_rows()) == 15
    assert {row["family"] for row in held_out_rows()} == set(HELD_OUT_FAMILIES) and len(held_out_rows()) == 5
    for row in ROWS:
        task = Path(row["task_dir"])
        assert task.parent == TASKS_DIR
        for name in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
            assert (task / name).is_file(), f"{row['id']}: {name} is missing"
        for script in ("tests/test.sh", "solution/solve.sh"):
            assert (task / script).stat().st_mode & stat.S_IXUSR, f"{row['id']}: {script} is not executable"
        assert row["oracle_command"] in (task / "solution/solve.sh").read_text()
        assert tomllib.loads((task / "task.toml").read_text())["environment"]["network_mode"] == "no-network"
        assert row["extra_instructions"] == [f"Hint: run `{row['oracle_command']}` in /app."]
        assert rows(hint=False)[ROWS.index(row)]["extra_instructions"] == []
    assert rows() == ROWS  # deterministic


async def test_every_task_scores_one_with_harbors_oracle_and_zero_with_its_no_op_agent(harbor_agents):
    limit = asyncio.Semaphore(4)

    async def reward(row, agent):
        async with limit:
            return await harbor_agents.generate(NO_GATEWAY, {**row, "harbor_agent": agent})

    oracle = await asyncio.gather(*(reward(row, "oracle") for row in ROWS))
    nothing = await asyncio.gather(*(reward(row, "nop") for row in ROWS))
    assert [row["id"] for row, score in zip(ROWS, oracle) if score != 1.0] == []
    assert [row["id"] for row, score in zip(ROWS, nothing) if score != 0.0] == []
    assert harbor_agents.exit_statuses["Verified"] == 40


def _probe_task(root: Path, solve: str, test: str) -> dict:
    """A one-off harbor task whose oracle runs `solve` and whose test.sh rewards 1 iff `test` succeeds."""
    for name, text in {"instruction.md": "probe\n", "environment/app/README.md": "probe\n",
                       "solution/solve.sh": f"#!/bin/bash\ncd /app\n{solve}\n",
                       "tests/test.sh": (f"#!/bin/bash\nif {test}; then echo 1; else echo 0; fi"
                                         " > /logs/verifier/reward.txt\n"),
                       "task.toml": '[environment]\nworkdir = "/app"\nnetwork_mode = "no-network"\n'}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return {"id": "probe", "task_dir": str(root), "harbor_agent": "oracle"}


async def test_the_sandbox_keeps_the_host_read_only_offline_and_leaves_no_process_behind(harbor_agents, tmp_path):
    marker = f"/usr/fullasync-probe-{os.getpid()}"
    private = f"/tmp/fullasync-probe-{os.getpid()}"
    nap = f"4321.{time.time_ns() % 10**12:012d}"  # a command line no other process has
    solve = (f"touch {marker} 2> /app/usr.err; echo private > {private}; (setsid sleep {nap} &); "
             "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\" 2> /app/net.err; "
             "ls /work /home > /app/ls.out 2>&1; echo done > /app/done")
    test = ("grep -q 'Read-only' /app/usr.err && grep -q 'unreachable' /app/net.err && "
            f"[ \"$(cat {private})\" = private ] && [ \"$(grep -c 'No such file' /app/ls.out)\" = 2 ]")
    row = _probe_task(tmp_path / "probe", solve, test)
    assert await harbor_agents.generate(NO_GATEWAY, row) == 1.0
    assert not Path(marker).exists() and not Path(private).exists()  # the sandbox's /tmp is its own
    assert await none_running(f"sleep {nap}")


async def test_a_task_whose_tests_write_no_reward_is_a_harness_error_not_a_zero(harbor_agents, tmp_path):
    row = _probe_task(tmp_path / "broken", "true", "true")
    (Path(row["task_dir"]) / "tests/test.sh").write_text("#!/bin/bash\nexit 0\n")
    with pytest.raises(HarnessError, match="RewardFileNotFoundError"):
        await harbor_agents.generate(NO_GATEWAY, row)


async def test_a_missing_harbor_interpreter_is_named_with_its_fix(tmp_path):
    generator = Terminus2Generator(TerminusConfig(harbor_python=str(tmp_path / "python3.12")))
    with pytest.raises(HarborMissingError, match="make setup-terminus"):
        await generator.setup()
    not_harbor = tmp_path / "python"
    not_harbor.symlink_to("/usr/bin/python3")  # an interpreter without harbor
    with pytest.raises(HarborMissingError, match="cannot run harbor"):
        await Terminus2Generator(TerminusConfig(harbor_python=str(not_harbor))).setup()




def test_settings_family_holds_out_names_never_trained_on_or_demonstrated(tmp_path):
    from fullasync_agents.swe_tasks.settings import WARMUP_NAMES
    from fullasync_agents.terminal_tasks.settings import setting_rows

    rows_ = setting_rows(cache_dir=tmp_path)
    train, held_out = setting_rows("train", cache_dir=tmp_path), setting_rows("held_out", cache_dir=tmp_path)
    assert (len(train), len(held_out)) == (160, 40) and len({row["id"] for row in rows_}) == 200
    train_names, held_names = {row["answer"] for row in train}, {row["answer"] for row in held_out}
    assert len(train_names) == 160 and len(held_names) == 40
    assert not (train_names | held_names) & set(WARMUP_NAMES) and not train_names & held_names
    for row, unhinted in zip(rows_, setting_rows(hint=False, cache_dir=tmp_path), strict=True):
        task = Path(row["task_dir"])
        assert row["extra_instructions"] == [f"Hint: run `{row['oracle_command']}` in /app."]
        assert unhinted["extra_instructions"] == [] and f"`mode={row['answer']}`" in row["instruction"]
        assert row["oracle_command"] in (task / "solution/solve.sh").read_text()
        assert row["answer"] not in "".join(path.read_text() for path in (task / "environment/app").iterdir())
        assert tomllib.loads((task / "task.toml").read_text())["metadata"]["oracle_command"] == row["oracle_command"]
        for script in ("tests/test.sh", "solution/solve.sh"):
            assert (task / script).stat().st_mode & stat.S_IXUSR, f"{row['id']}: {script} is not executable"
    assert setting_rows(cache_dir=tmp_path) == rows_ and len(list((tmp_path / "terminal-tasks").iterdir())) == 1


async def test_settings_tasks_score_one_with_the_oracle_and_zero_for_nothing_and_each_warm_up_mistake(
        harbor_agents, tmp_path):
    """20 of the 200 tasks (both splits; all are the same code with other names) through harbor's oracle and
    no-op agents, and the last one with each of the Terminus warm-up's mistakes run as its solution."""
    import shutil

    from examples.terminus.warmup import MISTAKES, fix_keystrokes
    from fullasync_agents.terminal_tasks.settings import setting_rows

    sample = setting_rows()[::10]
    limit = asyncio.Semaphore(4)

    async def reward(row, agent):
        async with limit:
            return await harbor_agents.generate(NO_GATEWAY, {**row, "harbor_agent": agent})

    assert await asyncio.gather(*(reward(row, "oracle") for row in sample)) == [1.0] * 20
    assert await asyncio.gather(*(reward(row, "nop") for row in sample)) == [0.0] * 20
    for mistake in MISTAKES:
        task = tmp_path / mistake
        shutil.copytree(sample[-1]["task_dir"], task)
        typed = "".join(fix_keystrokes(sample[-1]["answer"], mistake))
        ran = typed if typed.endswith("\n") else ""  # keystrokes without the newline are typed, never run
        (task / "solution/solve.sh").write_text(f"#!/bin/bash\ncd /app\n{ran}")
        assert await reward({**sample[-1], "task_dir": str(task)}, "oracle") == 0.0, mistake
