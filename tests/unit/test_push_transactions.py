"""A weight push is a transaction: published only when every engine holds the version; an install that fails is
tried again, then its engine is replaced (restarted with the new version) or the push fails naming it — never an
engine left serving a failed load. The weight sync is real; the engines are the simulator's, one of them made to
fail its installs (the edge)."""

from __future__ import annotations

import asyncio

import pytest

from fullasync.contracts.engine import PauseMode
from fullasync.errors import EngineDiedError, WeightPushError
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.weights import sync as weight_sync
from fullasync.weights.sync import WeightSync

COST = DecodeCost(step_base_s=1e-4, step_per_seq_s=0.0, max_num_seqs=16, push_s=1e-3)


class FailsToInstall(SimulatedEngine):
    """Its next `failures` updates break off (as a transfer cut mid-way), leaving it paused."""

    def __init__(self, name: str, failures: int) -> None:
        super().__init__(name, COST)
        self.failures = failures

    async def update_weights(self, weights, version: int) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the transfer broke off")
        await super().update_weights(weights, version)


def push(failures: int, restart: bool):
    """Push version 1 to a healthy engine and one whose next `failures` installs fail."""
    async def main():
        engines = [SimulatedEngine("sim-0", COST), FailsToInstall("sim-1", failures)]
        sync = WeightSync(engines, PauseMode.ABORT, restart_on_failure=restart)
        try:
            timing = await sync.push({"w": 1})
        except WeightPushError as error:
            return sync, None, error, [not await e.wait_resumed(0.0) for e in engines]  # paused?
        deaths = [e.death for e in engines]
        await sync.restart_dead()
        return sync, timing, deaths, [await e.version() for e in engines]

    return run_virtual(main)


def test_an_install_that_fails_once_is_tried_again_and_the_version_published():
    sync, timing, deaths, versions = push(failures=1, restart=True)
    assert timing.version == sync.version == 1 and deaths == [None, None] and versions == [1, 1]
    assert sync.failed_installs == 0


def test_an_engine_that_cannot_install_is_replaced_and_serves_the_new_version():
    sync, timing, deaths, versions = push(failures=2, restart=True)
    assert sync.version == 1 and sync.failed_installs == 1
    assert deaths[0] is None and "sim-1 is dead: it could not install weight version 1" in str(deaths[1])
    assert versions == [1, 1]  # restarted with the published version: one consistent version everywhere


def test_without_restarts_the_push_fails_naming_the_engine_which_stays_paused():
    sync, _, error, paused = push(failures=2, restart=False)
    assert "engine sim-1 could not install weight version 1 in 2 attempts" in str(error)
    assert sync.version == 0  # not published
    assert paused == [False, True]  # the failed engine serves nothing from its failed load


def test_checksums_compare_what_an_engine_holds_under_the_pushed_name_and_shape():
    import torch

    from fullasync.weights.digests import digest, mismatches, sampled_names

    pushed = {"norm.weight": torch.ones(4), "proj.weight": torch.eye(4), "embed.weight": torch.zeros(8, 4),
              "fused.weight": torch.ones(2, 4)}
    dims = {name: tensor.dim() for name, tensor in pushed.items()}
    assert sampled_names(dims, version=0) == ["norm.weight", "embed.weight"]
    assert sampled_names(dims, version=1)[-1] == "fused.weight"  # a different large tensor each version
    served = {"norm.weight": ((4,), "float32", digest(torch.ones(4)), 0, 1),
              "proj.weight": ([4, 4], "float32", digest(torch.eye(4) * 2), 0, 1),  # loaded otherwise than pushed
              "embed.weight": ((8, 4), "bfloat16", digest(torch.zeros(8, 4, dtype=torch.bfloat16)), 0, 1),  # cast
              "fused.weight": ((6, 4), "float32", "not comparable: another shape", 0, 1)}
    assert mismatches(pushed, served) == (3, ["proj.weight"])


def test_checksums_compare_each_tensor_parallel_workers_shard():
    import torch

    from fullasync.weights.digests import digest, mismatches

    pushed = {"column.weight": torch.arange(32.0).view(8, 4), "row.weight": torch.arange(32.0).view(4, 8),
              "norm.weight": torch.ones(4), "padded.weight": torch.zeros(10, 4)}
    rank1 = {"column.weight": ((4, 4), "float32", digest(torch.arange(16.0, 32.0).view(4, 4)), 1, 2),
             "row.weight": ((4, 4), "float32", digest(torch.arange(32.0).view(4, 8)[:, :4]), 1, 2),  # rank 0's shard
             "norm.weight": ((4,), "float32", digest(torch.ones(4)), 1, 2),  # replicated
             "padded.weight": ((6, 4), "float32", "a vocabulary shard with padding: not comparable", 1, 2)}
    assert mismatches(pushed, rank1) == (3, ["row.weight"])


def test_a_tensor_parallel_engine_on_cpu_binds_each_worker_to_its_own_cores():
    from fullasync.infra.platform import cpu_tensor_parallel_binding

    assert cpu_tensor_parallel_binding(2, cpus=[0, 1]) == "0|1"
    assert cpu_tensor_parallel_binding(2, cpus=[4, 5, 6, 7, 8]) == "4,5|6,7"  # equal groups; the odd core idle
    assert cpu_tensor_parallel_binding(4, cpus=[0, 1]) == "nobind"  # fewer cores than workers: they share them


class RecordsPause(SimulatedEngine):
    def __init__(self, name: str) -> None:
        super().__init__(name, COST)
        self.paused_at: float | None = None

    async def pause(self, mode: PauseMode) -> None:
        self.paused_at = asyncio.get_running_loop().time()
        await super().pause(mode)


def pause_times(mode: PauseMode, in_flight: dict[str, int]) -> list[float | None]:
    """When each engine paused for one push, with `in_flight` requests running on each (as the router counts)."""
    async def main():
        engines = [RecordsPause(name) for name in in_flight]
        await WeightSync(engines, mode, in_flight=in_flight.__getitem__).push({"w": 1})
        return [e.paused_at for e in engines]

    return run_virtual(main)


def test_an_abort_push_starts_engines_window_by_window_by_the_requests_it_interrupts():
    burst, rest = weight_sync.ABORT_BURST_REQUESTS, weight_sync.ABORT_REST_S
    # the first engine alone fills more than a window (its excess counts in the next); the next three start in the
    # following window, which the fourth overfills, so the fifth starts in the window after
    counts = {"a": burst + 10, "b": 1, "c": burst // 2, "d": burst, "e": 0}
    assert pause_times(PauseMode.ABORT, counts) == pytest.approx([0.0, rest, rest, rest, 2 * rest])


def test_a_push_that_interrupts_nothing_on_the_driver_starts_every_engine_at_once():
    counts = {name: 10 * weight_sync.ABORT_BURST_REQUESTS for name in "abc"}
    assert pause_times(PauseMode.RECOMPUTE, counts) == [0.0, 0.0, 0.0]  # the engine resumes them itself
    assert pause_times(PauseMode.WAIT, counts) == [0.0, 0.0, 0.0]


class DiesWhileStarting(SimulatedEngine):
    """Declared dead; its next `failures` restarts die during start (as an actor killed while it loads)."""

    def __init__(self, name: str, failures: int) -> None:
        super().__init__(name, COST)
        self.failures, self.restarts = failures, 0
        self.mark_dead("killed")

    async def restart(self, weights, version: int) -> None:
        self.restarts += 1
        if self.failures:
            self.failures -= 1
            raise EngineDiedError(f"engine {self.name} died during start")
        await super().restart(weights, version)


def supervise(failures: int, probes: int = weight_sync.RESTART_ATTEMPTS + 1):
    """The supervisor probing every second for `probes` seconds, its engine dying in its first `failures` restarts."""
    async def main():
        engine = DiesWhileStarting("sim-0", failures)
        sync = WeightSync([engine], PauseMode.ABORT, restart_on_failure=True)
        supervisor = asyncio.ensure_future(sync.supervise(1.0))
        await asyncio.sleep(probes + 0.5)
        ended = supervisor.done()
        supervisor.cancel()
        return engine, sync, ended

    return run_virtual(main)


def test_an_engine_that_dies_again_while_restarting_is_restarted_at_the_next_probe_a_few_times_in_a_row():
    engine, sync, ended = supervise(failures=weight_sync.RESTART_ATTEMPTS - 1)
    assert engine.death is None and not ended and engine.restarts == weight_sync.RESTART_ATTEMPTS
    assert sync.restarts == 1
    sync.check_engines()  # nothing ends the run
    engine, sync, ended = supervise(failures=weight_sync.RESTART_ATTEMPTS)
    assert ended and engine.restarts == weight_sync.RESTART_ATTEMPTS and engine.death is not None
    with pytest.raises(EngineDiedError, match="could not be restarted: .*died during start"):
        sync.check_engines()


class RecordsRestarts(SimulatedEngine):
    """Records the (virtual) time of each restart."""

    def __init__(self, name: str) -> None:
        super().__init__(name, COST)
        self.restarted_at: list[float] = []

    async def restart(self, weights, version: int) -> None:
        self.restarted_at.append(asyncio.get_running_loop().time())
        await super().restart(weights, version)


def test_a_death_is_heard_the_instant_it_is_declared_no_poll_between_it_and_the_restart():
    """On the virtual clock time moves only when something sleeps: an engine restarted at the very time it was
    declared dead (twice, 3.3 s and 41.7 s in, with a 5 s retry pause configured) was restarted without any poll
    between the death and the supervisor; a client waiting for an engine to serve again hears of the restart the
    same way."""

    async def main():
        loop = asyncio.get_running_loop()
        engines = [RecordsRestarts("sim-0"), RecordsRestarts("sim-1")]
        sync = WeightSync(engines, PauseMode.ABORT, restart_on_failure=True)
        supervisor = asyncio.ensure_future(sync.supervise(5.0))
        loop.call_later(3.3, engines[1].mark_dead, "killed by the test")
        loop.call_later(41.7, engines[0].mark_dead, "killed by the test")
        await asyncio.sleep(60.0)
        supervisor.cancel()
        return [e.restarted_at for e in engines], sync.restarts

    restarted, count = run_virtual(main)
    assert restarted == [[41.7], [3.3]] and count == 2


def test_a_call_waiting_for_an_engine_hears_of_its_restart_when_it_happens():
    from fullasync.engines.router import EngineRouter

    async def main():
        loop = asyncio.get_running_loop()
        engine = SimulatedEngine("sim-0", COST)
        engine.mark_dead("killed by the test")
        loop.call_later(7.25, lambda: asyncio.ensure_future(engine.restart(None, 1)))
        router = EngineRouter([engine])
        alive = await router.wait_alive(100.0)
        served_at = loop.time()
        engine.mark_dead("killed again")
        timed_out = await router.wait_alive(2.0)
        return alive, served_at, timed_out, loop.time()

    alive, served_at, timed_out, ended = run_virtual(main)
    assert alive and served_at == 7.25  # not the next half-second poll
    assert not timed_out and ended == 7.25 + 2.0
