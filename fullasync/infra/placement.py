"""Where components run on a Ray cluster: GPUs per engine and trainer rank, custom Ray resources that pin them.

Owns: the start-up check that some node of the running cluster offers each of a component's `ray_resources`
(`require_cluster_offers`; their rules are the config's, `fullasync.config.checks`), so a typo fails at once with
the resources the cluster has instead of an actor waiting for a node that never comes.
GPUs: `plan_gpus` proves, before anything starts, that each engine's `engine.tensor_parallel_size` GPUs and the
trainer's ranks (one GPU each, packed on one node) fit the cluster's nodes, or names what does not fit;
`where_am_i` and `layout_table` report where each actor landed and which GPUs Ray gave it.
Does not own: the actors' options (`engines/vllm/`, `trainer/worker_group.py`) or how Ray
is started or joined (`runtime.py`).

A node offers a custom resource when started with it, e.g. `ray start --resources='{"engine_node": 1}'`;
a component asking `{"engine_node": 0.01}` then runs only on such nodes (a small amount, so many
actors fit on one node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fullasync.config.checks import PREDEFINED_RESOURCES
from fullasync.errors import FullasyncError


class LayoutError(FullasyncError, ValueError):
    """The components' GPUs do not fit the cluster's nodes; the message names the numbers and what to change."""


def require_cluster_offers(field_name: str, resources: Mapping[str, float]) -> None:
    """Raise ValueError unless some node of the running Ray cluster offers at least each amount asked.

    Checked against each node's total (not what is free now): a busy node frees up, a missing one does not.
    """
    if not resources:
        return
    import ray

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    for name, amount in resources.items():
        offered = [node["Resources"].get(name, 0.0) for node in nodes]
        if not any(total >= amount for total in offered):
            known = sorted({key for node in nodes for key in node["Resources"] if _is_custom(key)})
            raise ValueError(
                f"{field_name} asks for {{{name!r}: {amount}}} but no live node of the Ray cluster offers that much "
                f"(most on one node: {max(offered, default=0.0)}); start a node with "
                f"`ray start --resources='{{\"{name}\": 1}}'` or fix the name (custom resources of this cluster: "
                f"{known})"
            )


def _is_custom(resource: str) -> bool:
    """A resource a user gave a node (not Ray's own, a node's address label, or a placement-group share)."""
    own = resource in PREDEFINED_RESOURCES or resource.startswith(("node:", "accelerator_type:"))
    return not own and "_group_" not in resource


def gpu_blocks(num_engines: int, gpus_per_engine: int, trainer_ranks: int) -> list[tuple[str, int]]:
    """What must fit on one node each: the trainer's ranks together (one placement group, packed), and each engine's
    tensor-parallel GPUs."""
    return [("trainer", trainer_ranks), *((f"engine {index}", gpus_per_engine) for index in range(num_engines))]


def plan_gpus(blocks: Sequence[tuple[str, int]], node_gpus: Mapping[str, float]) -> dict[str, str]:
    """A node for each block (component, GPUs it needs on one node): the largest blocks first, each onto the node
    with the most GPUs left. Proves that a layout exists (Ray places the actors itself, possibly elsewhere); raises
    LayoutError naming what does not fit and what the nodes have."""
    left = {node: int(gpus) for node, gpus in node_gpus.items()}
    plan: dict[str, str] = {}
    for component, gpus in sorted(blocks, key=lambda block: -block[1]):
        if gpus == 0:
            continue
        node = max(left, key=lambda name: left[name], default=None)
        if node is None or left[node] < gpus:
            needed = ", ".join(f"{name} {count}" for name, count in blocks if count)
            raise LayoutError(
                f"this layout needs GPUs on one node per block ({needed}; {sum(c for _, c in blocks)} in all) and "
                f"the Ray cluster's nodes have {dict(node_gpus) or 'no GPUs'}: {component} ({gpus} GPUs) fits "
                "nowhere; lower engine.num_engines, engine.tensor_parallel_size or trainer.num_workers, or add nodes")
        left[node] -= gpus
        plan[component] = node
    return plan


def cluster_gpus() -> dict[str, float]:
    """GPUs of each live node of the running Ray cluster, by node address and id."""
    import ray

    return {f"{node['NodeManagerAddress']} ({node['NodeID'][:8]})": node["Resources"].get("GPU", 0.0)
            for node in ray.nodes() if node.get("Alive")}


def where_am_i() -> tuple[str, list[str]]:
    """This Ray actor's node (address and id) and the GPU ids Ray assigned it (its CUDA_VISIBLE_DEVICES)."""
    import ray

    context = ray.get_runtime_context()
    return (f"{ray.util.get_node_ip_address()} ({context.get_node_id()[:8]})",
            [str(gpu) for gpu in ray.get_gpu_ids()])


def layout_table(rows: Sequence[tuple[str, str, Sequence[str]]]) -> str:
    """What runs where, one line per component: name, node, GPUs."""
    width = max((len(name) for name, _, _ in rows), default=9)
    lines = [f"{'component':<{width}}  node{'':<24}  GPUs"]
    lines += [f"{name:<{width}}  {node:<28}  {','.join(gpus) or '-'}" for name, node, gpus in rows]
    return "\n".join(lines)
