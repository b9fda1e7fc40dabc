"""The typed seams: the `Engine` protocol is complete and the simulator's engine satisfies it, `WeightSync` pushes
through its `WeightTransport` as a start → update → finish transaction, the simulated trainer is a `Trainer`.
(`RayEngine` is checked against the same protocol in `integration/test_engine_protocol.py`: it imports Ray.)"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import pytest

from fullasync.contracts.engine import Engine, GenerateRequest, InstallTiming, PauseMode
from fullasync.contracts.run import Trainer
from fullasync.contracts.weights import StreamedWeights, WeightsMovedOn, WeightsPayload, WeightTransport
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.trainer import SimulatedTrainer, TrainCost
from fullasync.weights.sync import WeightSync
from fullasync.weights.transport import ObjectStoreTransport, StreamTransport

STREAMING = {"generate_stream"}  # async generators
PLAIN = {"mark_dead"}  # plain calls; every other method of the protocol is a coroutine
PROPERTIES = {"name", "death", "workers", "kv_tokens"}


def protocol_methods(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)}


def assert_implements_engine(implementation: type) -> None:
    """Every protocol method exists with the same parameters and the same kind (coroutine or async generator)."""
    for name in protocol_methods(Engine):
        expected, actual = getattr(Engine, name), getattr(implementation, name, None)
        assert actual is not None, f"{implementation.__name__} lacks Engine.{name}"
        assert list(inspect.signature(actual).parameters) == list(inspect.signature(expected).parameters), name
        if name in STREAMING:
            assert inspect.isasyncgenfunction(actual), f"{implementation.__name__}.{name} must be an async generator"
        elif name in PLAIN:
            assert inspect.isfunction(actual) and not inspect.iscoroutinefunction(actual), name
        else:
            assert inspect.iscoroutinefunction(actual), f"{implementation.__name__}.{name} must be async"


def test_the_engine_protocol_holds_everything_callers_use():
    used = {"generate", "generate_stream", "abort", "pause", "resume", "wait_resumed", "update_weights", "install",
            "restart", "version", "num_in_flight", "in_flight_tokens", "shutdown", "mark_dead", "kv_stats",
            "wait_dead", "wait_serving"}
    assert protocol_methods(Engine) == used
    assert PROPERTIES <= set(vars(Engine))


async def test_the_simulated_engine_satisfies_the_engine_protocol():
    engine = SimulatedEngine("sim-0", DecodeCost(step_base_s=0.001, push_s=0.0))
    try:
        assert isinstance(engine, Engine)
        assert_implements_engine(SimulatedEngine)
        items = [item async for item in engine.generate_stream(GenerateRequest("r", (1, 2), 3))]
        assert [len(getattr(item, "output_ids", ())) for item in items] == [3, 3]  # one delta, then the result
        assert await engine.in_flight_tokens() == {}
        engine.mark_dead("killed by the test")
        assert (await engine.wait_dead()) is engine.death  # at once: it is dead now
        await engine.restart(None, 5)
        assert await engine.version() == 5 and engine.death is None
        await engine.wait_serving()  # at once: it serves again
    finally:
        await engine.shutdown()


class RecordingTransport:
    """A `WeightTransport` that records the order of its calls around the real object-store one."""

    def __init__(self) -> None:
        self.inner = ObjectStoreTransport()
        self.calls: list[tuple[str, int]] = []

    async def start_weight_update(self, weights: WeightsPayload, version: int, engines: Sequence[Engine]) -> None:
        self.calls.append(("start", version))
        self.planned = [engine.name for engine in engines]
        await self.inner.start_weight_update(weights, version, engines)

    async def update_weights(self, engine: Engine, version: int, mode: PauseMode) -> InstallTiming:
        self.calls.append((f"update {engine.name}", version))
        return await self.inner.update_weights(engine, version, mode)

    async def finish_weight_update(self, version: int) -> None:
        self.calls.append(("finish", version))
        await self.inner.finish_weight_update(version)

    async def materialize(self, weights: WeightsPayload) -> WeightsPayload:
        return await self.inner.materialize(weights)


async def test_a_push_is_one_transaction_of_the_weight_transport():
    engines = [SimulatedEngine(f"sim-{i}", DecodeCost(push_s=0.0)) for i in range(2)]
    transport = RecordingTransport()
    assert isinstance(transport, WeightTransport) and isinstance(ObjectStoreTransport(), WeightTransport)
    sync = WeightSync(engines, transport=transport)
    try:
        timing = await sync.push({})
        assert timing.version == 1 and [await e.version() for e in engines] == [1, 1]
        assert transport.calls == [("start", 1), ("update sim-0", 1), ("update sim-1", 1), ("finish", 1)]
        assert transport.planned == ["sim-0", "sim-1"]  # the transport knows who takes part before any update
        assert isinstance(WeightSync(engines).transport, ObjectStoreTransport)  # the default
    finally:
        for engine in engines:
            await engine.shutdown()


async def test_the_object_store_transport_refuses_an_update_outside_its_push():
    engine = SimulatedEngine("sim-0", DecodeCost(push_s=0.0))
    transport = ObjectStoreTransport()
    try:
        await transport.start_weight_update({}, 3, [engine])
        with pytest.raises(RuntimeError, match=r"version=4.*start_weight_update"):
            await transport.update_weights(engine, 4, PauseMode.ABORT)
    finally:
        await engine.shutdown()


async def test_each_transport_refuses_the_other_ones_weights_saying_which_setting_matches():
    with pytest.raises(TypeError, match="trainer.weight_transport=stream.*StreamTransport"):
        await ObjectStoreTransport().start_weight_update(StreamedWeights(step=0), 1, [])
    with pytest.raises(TypeError, match="set trainer.weight_transport=stream"):
        await StreamTransport(trainer=None).start_weight_update({}, 1, [])  # type: ignore[arg-type]


class HeldUntilStepped:
    """A streamed push's transport whose trainer has stepped on (`moved`) or still holds the pushed weights."""

    def __init__(self) -> None:
        self.inner = ObjectStoreTransport()
        self.moved = True
        self.materialized: list[StreamedWeights] = []

    async def start_weight_update(self, weights, version, engines) -> None:
        await self.inner.start_weight_update({}, version, engines)

    async def update_weights(self, engine, version, mode):
        return await self.inner.update_weights(engine, version, mode)

    async def finish_weight_update(self, version) -> None:
        await self.inner.finish_weight_update(version)

    async def materialize(self, weights):
        if not isinstance(weights, StreamedWeights):
            return weights
        if self.moved:
            raise WeightsMovedOn(f"not those of step {weights.step}")
        self.materialized.append(weights)
        return {}


async def test_an_engine_dead_after_a_streamed_push_restarts_only_with_the_weights_the_trainer_still_holds():
    engines = [SimulatedEngine(f"sim-{i}", DecodeCost(push_s=0.0)) for i in range(2)]
    transport = HeldUntilStepped()
    sync = WeightSync(engines, transport=transport, restart_on_failure=True)
    try:
        await sync.push(StreamedWeights(step=1))
        engines[1].mark_dead("killed by the test")
        assert await sync.restart_dead() == []  # the trainer has stepped on: the restart waits
        assert engines[1].death is not None
        transport.moved = False
        await sync.push(StreamedWeights(step=2))  # the push after the step takes them for the dead engine at once
        assert transport.materialized == [StreamedWeights(step=2)]
        transport.moved = True  # the trainer steps on again: the taken weights still serve the restart
        assert await sync.restart_dead() == ["sim-1"]
        assert engines[1].death is None and await engines[1].version() == sync.version == 2
    finally:
        for engine in engines:
            await engine.shutdown()


def test_the_simulated_trainer_is_a_trainer():
    assert isinstance(SimulatedTrainer(TrainCost(1e-3, 0.1), 1), Trainer)
