"""Episode containers through a node's sandbox service (container.placement=cluster) on the suite's Ray cluster.

The service owns a podman store of its own (`node_store`; images read from this host's store too), so a command that
went through the driver's podman would find no such container: the tests check that it does not, that the relay a
harness is given reaches the container (output, exit status, stdin, the row's tests), that it runs nothing but `exec`
into this run's containers, that a client killed at its timeout ends the command on the node, and that a service
SIGKILLed under a running container fails its calls as an infrastructure failure and leaves no container behind.
(The two-node run in test_multinode.py places a training run's containers on both nodes.)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import ray
from agents_common import cluster_container_settings, our_containers, podman_required  # noqa: F401

from fullasync.errors import InfraError
from fullasync_agents import sandbox_nodes
from fullasync_agents.mini_swe.generator import MiniSweAgentGenerator
from fullasync_agents.swe_tasks import setting_rows
from fullasync_agents.swe_tasks.records import swe_record

TOY = setting_rows("train")[0]
TASK = MiniSweAgentGenerator._task(swe_record(TOY))
pytestmark = pytest.mark.usefixtures("podman_required")


@pytest.fixture(scope="module")
def node_settings():
    store = tempfile.mkdtemp(prefix="fa-nodes-", dir="/tmp")  # short: podman's runroot holds sockets
    yield cluster_container_settings(store)
    shutil.rmtree(store, ignore_errors=True)


@pytest.fixture
async def cluster(ray_cluster, node_settings):
    from fullasync_agents.sandbox_nodes import ClusterSandboxes

    sandboxes = ClusterSandboxes(node_settings)
    yield sandboxes
    await sandboxes.close()


def relay(sandbox, *argv: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`<executable> <argv>` as a harness runs it (mini-swe-agent's DockerEnvironment: stdout and stderr joined)."""
    return subprocess.run([sandbox.executable, *argv], input=stdin, text=True, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)


async def test_a_node_service_runs_the_episode_on_its_own_store_and_the_relay_reaches_it(cluster):
    before = our_containers()
    sandbox = await cluster.start(TASK, "node-episode-1")
    (node,) = cluster.services
    assert sandbox.node == node and cluster.started[node] == 1
    assert (await cluster.running())[node] == [sandbox.id]
    assert our_containers() == before  # not in the driver's podman: a harness going through it fails ...
    direct = subprocess.run(["podman", "exec", sandbox.id, "true"], capture_output=True, text=True, check=False)
    assert direct.returncode != 0 and "no such container" in direct.stderr.lower()

    command = "pwd; echo $WHO; git log --all --oneline | wc -l; echo err >&2; exit 3"
    ran = await asyncio.to_thread(relay, sandbox, "exec", "-w", sandbox.workdir, "-e", "WHO=relay", sandbox.id,
                                  "bash", "-lc", command)
    assert ran.returncode == 3
    assert ran.stdout.split() == [sandbox.workdir, "relay", "1", "err"]  # ... and the relay reaches it
    piped = await asyncio.to_thread(relay, sandbox, "exec", "-i", sandbox.id, "bash", "-lc", "cat > note && cat note",
                                    stdin="through stdin\n")
    assert (piped.returncode, piped.stdout) == (0, "through stdin\n")

    for argv, why in [(["rm", "-f", sandbox.id], "runs `exec` only"),
                      (["exec", "--privileged", sandbox.id, "true"], "does not pass exec's option"),
                      (["exec", "0123456789ab", "true"], "no episode container 0123456789ab"),
                      (["exec", sandbox.id], "names no container and command")]:
        refused = await asyncio.to_thread(relay, sandbox, *argv)
        assert refused.returncode == 125 and why in refused.stdout, (argv, refused.stdout)

    with pytest.raises(subprocess.TimeoutExpired):  # the harness's own timeout kills the client ...
        await asyncio.to_thread(relay, sandbox, "exec", sandbox.id, "bash", "-lc", "sleep 300", timeout=2)
    deadline = time.monotonic() + 30
    while _podman_execs("sleep 300") and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _podman_execs("sleep 300"), "the relayed command outlived its client"  # ... and its exec ends

    assert (await cluster.score(sandbox, 60)).reward == 0.0  # the toy's bug is still there
    solved = await asyncio.to_thread(relay, sandbox, "exec", "-w", sandbox.workdir, sandbox.id, "bash", "-lc",
                                     TOY["oracle_command"])
    assert solved.returncode == 0, solved.stdout
    assert (await cluster.score(sandbox, 60)).reward == 1.0
    await cluster.finish(sandbox)
    assert (await cluster.running())[node] == [] and our_containers() == before


def _podman_execs(needle: str) -> list[str]:
    listed = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout.splitlines()
    return [line for line in listed if " exec " in line and needle in line and "podman" in line]


class ProbedService:
    """A node's service as the driver's probe meets it: `info` fails as a call to a dead actor does for each of
    `failures`, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0
        self.info = self

    def remote(self):
        self.calls += 1
        calls = self.calls

        async def answer():
            if calls <= self.failures:
                raise ray.exceptions.ActorDiedError()
            return {"pid": 1}
        return answer()


@pytest.mark.parametrize("failures", [1, sandbox_nodes.PROBE_TRIES])
async def test_a_probe_sent_as_the_service_died_asks_again_and_gives_up_only_after_its_tries(node_settings, failures,
                                                                                           monkeypatch):
    """A probe sent before Ray saw the service die fails though Ray starts the service again (what a loaded machine
    made of the test below): the node comes back at the next answer; a service failing every try is gone."""
    monkeypatch.setattr(sandbox_nodes, "PROBE_BACKOFF_S", 0.0)
    cluster = sandbox_nodes.ClusterSandboxes(node_settings)
    cluster.services["node"] = service = ProbedService(failures)
    cluster._down["node"] = probe = asyncio.ensure_future(cluster._probe("node"))
    await probe
    back = failures < sandbox_nodes.PROBE_TRIES
    assert ("node" not in cluster._down) is back
    assert service.calls == (failures + 1 if back else sandbox_nodes.PROBE_TRIES)


async def test_a_killed_service_fails_its_calls_as_infrastructure_and_leaves_no_container(cluster):
    sandbox = await cluster.start(TASK, "node-episode-2")
    (node,) = cluster.services
    info = await cluster.services[node].info.remote()
    os.kill(info["pid"], signal.SIGKILL)
    with pytest.raises(InfraError, match="sandbox service of node .* failed during score"):
        await cluster.score(sandbox, 60)
    deadline = time.monotonic() + 120
    while node in cluster._down and time.monotonic() < deadline:  # Ray starts it again on its node
        await asyncio.sleep(0.2)
    assert node not in cluster._down
    assert (await cluster.services[node].info.remote())["pid"] != info["pid"]
    assert (await cluster.running())[node] == []  # the new service removed what the dead one left
    await cluster.finish(sandbox)  # an episode ending after the death still ends cleanly
    again = await cluster.start(TASK, "node-episode-3")
    assert (await cluster.running())[node] == [again.id]
    await cluster.finish(again)
    assert (await cluster.running())[node] == []
