"""Where components run on a Ray cluster: custom Ray resources that pin engines and trainer ranks to nodes.

Owns: the rules for a component's `ray_resources` (`check_ray_resources`, pure: usable in config
validation without Ray) and the start-up check that some node of the running cluster offers each
of them (`require_cluster_offers`), so a typo fails at once with the resources the cluster has
instead of an actor waiting for a node that never comes.
Does not own: the actors' options (`engines/vllm_engine.py`, `trainer/worker_group.py`) or how Ray
is started or joined (`runtime.py`).

A node offers a custom resource when started with it, e.g. `ray start --resources='{"engine_node": 1}'`;
a component asking `{"engine_node": 0.01}` then runs only on such nodes (a small amount, so many
actors fit on one node).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# Ray's own resources are asked for through num_cpus / num_gpus / memory, never through `resources`.
PREDEFINED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_ray_resources(field_name: str, resources: Mapping[str, float]) -> None:
    """Raise ValueError naming `field_name` unless `resources` is a valid Ray custom-resource request.

    Names are non-empty strings other than Ray's predefined resources; amounts are finite and > 0,
    and whole numbers when above 1 (Ray's rule for fractional resources).
    """
    if not isinstance(resources, Mapping):
        raise ValueError(f"{field_name}={resources!r} must be a mapping of resource name to amount, "
                         'e.g. {"engine_node": 0.01}')
    for name, amount in resources.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{field_name}: resource name {name!r} must be a non-empty string")
        if name in PREDEFINED_RESOURCES:
            raise ValueError(f"{field_name}: {name!r} is one of Ray's predefined resources; list only custom "
                             "resources here (CPUs and GPUs are set by the component's own fields)")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise ValueError(f"{field_name}[{name!r}]={amount!r} must be a number")
        if not math.isfinite(amount) or amount <= 0:
            raise ValueError(f"{field_name}[{name!r}]={amount!r} must be finite and > 0")
        if amount > 1 and amount != int(amount):
            raise ValueError(f"{field_name}[{name!r}]={amount!r}: Ray allows fractions only up to 1; "
                             "use a whole number or a fraction <= 1")


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
