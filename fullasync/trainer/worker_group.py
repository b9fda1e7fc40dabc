"""The trainer's Ray actors: N `TrainerWorker` ranks packed on one node, called with timeouts.

Owns: the placement group (STRICT_PACK, so loopback rendezvous is valid; on a node that offers the
custom `ray_resources`, when given), actor creation with the worker environment (threads, the verl
CPU platform hook), the rendezvous port, and every wait on a rank, each bounded by a timeout.
Does not own: what the ranks compute.

Ordering rule: `submit` sends a call to every rank without yielding to the event loop, so all
ranks see calls in the same order, which verl's collectives require.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar, cast

import ray
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fullasync.config.checks import parse_cpus
from fullasync.errors import TrainerWorkerDiedError
from fullasync.infra.placement import require_cluster_offers
from fullasync.trainer.worker import TrainerWorker, WorkerSpec

Reply: TypeAlias = Any  # what a rank method returns: Ray calls it by name, untyped; each caller states the type
T = TypeVar("T")


@dataclass(frozen=True)
class WorkerResources:
    """What one rank reserves from Ray and the environment its process starts with."""

    num_cpus: float
    num_gpus: float
    env_vars: dict[str, str]
    ray_resources: Mapping[str, float] = field(default_factory=dict)  # custom resources: pin the ranks' node


async def place_ranks(num_workers: int, resources: WorkerResources, timeout_s: float) -> PlacementGroup:
    """One placement group of `num_workers` bundles (each a rank's CPUs, GPU and custom resources), packed on one
    node; ready within `timeout_s` or a TimeoutError saying what was asked and what Ray has free."""
    custom = dict(resources.ray_resources)
    require_cluster_offers(f"trainer.ray_resources (x {num_workers} ranks packed on one node)",
                           {name: amount * num_workers for name, amount in custom.items()})
    bundle = {"CPU": resources.num_cpus, **({"GPU": resources.num_gpus} if resources.num_gpus else {}), **custom}
    group = placement_group([dict(bundle) for _ in range(num_workers)], strategy="STRICT_PACK")
    try:
        await asyncio.wait_for(group.ready(), timeout_s)
    except TimeoutError as error:
        remove_placement_group(group)
        raise TimeoutError(
            f"the trainer could not reserve {num_workers} × {bundle} from Ray within {timeout_s:.0f} s; "
            f"available: {ray.available_resources()}"
        ) from error
    return group


def rank_options(group: PlacementGroup, rank: int, resources: WorkerResources, name: str) -> dict[str, Any]:
    """Ray options of trainer rank `rank`: its bundle of `group`, so Ray gives it that bundle's GPU."""
    return dict(name=name, num_cpus=resources.num_cpus, num_gpus=resources.num_gpus,
                resources=dict(resources.ray_resources),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
                runtime_env={"env_vars": resources.env_vars})


class WorkerGroup:
    """Ranks 0..N-1 of the trainer; create with `await WorkerGroup.start(...)`."""

    def __init__(self, actors: list[ActorHandle[TrainerWorker]], group: PlacementGroup, call_timeout_s: float) -> None:
        self.actors = actors
        self.placement_group = group
        self.call_timeout_s = call_timeout_s

    @classmethod
    async def start(
        cls, spec: WorkerSpec, num_workers: int, resources: WorkerResources, timeout_s: float
    ) -> tuple[WorkerGroup, float]:
        """Place, create and set up `num_workers` ranks; returns the group and the slowest rank's setup seconds."""
        group = await place_ranks(num_workers, resources, timeout_s)
        name = f"trainer-{uuid.uuid4().hex[:6]}"
        remote_class = ray.remote(TrainerWorker)
        actors = [
            cast("ActorHandle[TrainerWorker]", remote_class.options(
                **rank_options(group, rank, resources, f"{name}-rank{rank}"),
            ).remote(rank, num_workers, spec))  # Ray types `.remote()` as a handle or the class
            for rank in range(num_workers)
        ]
        workers = cls(actors, group, call_timeout_s=timeout_s)
        try:
            (port,) = await workers.wait(workers.submit_to(0, "free_port"), "free_port")
            setup_seconds = await workers.call("setup", port)
        except BaseException:
            await workers.shutdown()
            raise
        workers.call_timeout_s = spec.config.call_timeout_s
        return workers, max(setup_seconds)

    def submit(self, method: str, *args: object) -> list[ObjectRef[Reply]]:
        """Send the same call to every rank (no await in between: ranks see calls in one order)."""
        return [getattr(a, method).remote(*args) for a in self.actors]

    def submit_returning(self, method: str, num_returns: int, *args: object) -> list[list[ObjectRef[Reply]]]:
        """`submit` for a method that returns `num_returns` values: one reference per value, per rank."""
        return [getattr(a, method).options(num_returns=num_returns).remote(*args) for a in self.actors]

    def submit_each(self, method: str, per_rank_args: Sequence[tuple[object, ...]]) -> list[ObjectRef[Reply]]:
        """Send rank r the call with `per_rank_args[r]`."""
        if len(per_rank_args) != len(self.actors):
            raise ValueError(f"{len(per_rank_args)} argument tuples for {len(self.actors)} ranks")
        return [getattr(a, method).remote(*args) for a, args in zip(self.actors, per_rank_args, strict=True)]

    def submit_to(self, rank: int, method: str, *args: object) -> list[ObjectRef[Reply]]:
        return [getattr(self.actors[rank], method).remote(*args)]

    async def wait(self, refs: Sequence[Awaitable[T]], method: str, timeout_s: float | None = None) -> list[T]:
        """Results of `refs` in rank order; raises TimeoutError or TrainerWorkerDiedError naming `method`."""
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.gather(*refs), timeout)
        except TimeoutError as error:
            raise TimeoutError(f"trainer call {method!r} took longer than {timeout:.0f} s") from error
        except RayActorError as error:
            raise TrainerWorkerDiedError(f"a trainer rank died during {method!r}: {error}") from error

    async def call(self, method: str, *args: object, timeout_s: float | None = None) -> list[Reply]:
        return await self.wait(self.submit(method, *args), method, timeout_s)

    async def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        remove_placement_group(self.placement_group)


def worker_env_vars(on_cpu: bool, threads: int) -> dict[str, str]:
    """Environment of a rank: thread counts on purpose (Ray sets OMP_NUM_THREADS=1), the CPU platform hook.

    OMP_WAIT_POLICY=PASSIVE: with cores shared (vLLM engines, other ranks), spinning OpenMP
    threads made a 2-thread train step ~30x slower than 1 thread (2.2 s vs 0.05 s, tiny model,
    2 busy cores); passive waits keep 2 threads at 0.05-0.08 s.
    """
    env = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        # exported weights go into Ray's object store as buffers the engine actor reads without a copy
        # (bench/weight_push.py --zero-copy-export measures it)
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    }
    if on_cpu:
        from fullasync_patches import verl_cpu

        env.update(verl_cpu.worker_env_vars())
    return env


def default_threads(num_workers: int, cpus: str = "") -> int:
    """Torch threads per rank: its share of `cpus` (trainer.cpus), or of the machine's cores."""
    cores = len(parse_cpus("trainer.cpus", cpus)) or os.cpu_count() or 1
    return max(1, cores // num_workers)
