"""A trainer rank that dies costs a restart, not the run: the trainer starts again from the newest complete
checkpoint, trains again the steps since, and the step under way goes on (`TrainingLoop._heal`).

Control code real (Rollouter, queue, WeightSync, TrainingLoop, Run, the checkpoint writer); engines and trainer
the simulator's, on its virtual clock. The simulated trainer's "model" is the list of rows it trained, lost with
its process: what it holds at the end is what the weights that go on were trained on.
"""

from __future__ import annotations

import pytest
from test_checkpoint import FINAL, Harness, parts, rows, run_settings

from fullasync.client import ClientConfig, RolloutService
from fullasync.errors import TrainerWorkerDiedError
from fullasync.observe.metrics import MetricsSink, format_line
from fullasync.run.assemble import assemble
from fullasync.run.checkpoint import CheckpointPolicy
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer
from fullasync.sim.trainer import SimulatedTrainer, TrainCost


class DyingTrainer(SimulatedTrainer):
    """A rank dies half-way through the train_step calls numbered in `deaths` (counted over restarts)."""

    def __init__(self, deaths: set[int]) -> None:
        super().__init__(TrainCost(1e-3, 0.5), 1)
        self.deaths, self.calls, self.restarts = deaths, 0, 0

    async def train_step(self, batch, trainer_version=None, late=None):
        self.calls += 1
        if self.calls in self.deaths:
            await super().train_step(batch, trainer_version)  # half-way: the work is lost with the rank
            self.trained_rows = self.trained_rows[: -len(batch.groups)]
            raise TrainerWorkerDiedError(f"a trainer rank died during 'train_step' (call {self.calls})")
        return await super().train_step(batch, trainer_version, late)

    async def restart(self) -> None:
        self.restarts += 1
        await super().restart()


def run_with(tmp_path, trainer, restarts: int, every: int = 3, total_steps: int = 8):
    async def main():
        engines, _, service = parts()
        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=Harness(),
                             settings=run_settings(total_steps=total_steps, trainer_restarts=restarts),
                             sink=MetricsSink(tmp_path / "metrics.jsonl"),
                             checkpoints=CheckpointPolicy(tmp_path / "checkpoints", every=every, keep=1)
                             if every else None)
        return await run.execute(rows())

    return run_virtual(main)


def test_a_rank_that_dies_mid_step_and_again_while_healing_costs_two_restarts_and_nothing_else(tmp_path, caplog):
    # steps 1-3, checkpoint, step 4; step 5 dies (call 5); the restart's replay of step 4 dies too (call 6)
    trainer = DyingTrainer(deaths={5, 6})
    result = run_with(tmp_path, trainer, restarts=3)
    assert result.steps == 8 and result.trainer_restarts == 2 == trainer.restarts
    assert result.summary()["trainer_restarts"] == 2 and result.trainer_restart_s > 0
    # the weights that go on were trained on every trained row once, and on nothing else
    assert len(trainer.trained_rows) == len(set(trainer.trained_rows))
    assert set(trainer.trained_rows) == {r for r, o in result.row_outcomes.items() if o == "trained"}
    assert result.outcomes["trained"] == 16 and set(result.row_outcomes.values()) <= FINAL | {"unfinished"}
    # versions only grow, one per step: the restarted lineage's first push is the next version
    assert [step["version"] for step in result.history] == list(range(1, 9))
    assert [step["trainer/restarts"] for step in result.history] == [0, 0, 0, 0, 2, 2, 2, 2]
    said = [r.getMessage() for r in caplog.records]
    assert sum("restarting the trainer" in line for line in said) == 2
    assert any("trainer restarted from" in line and "step_00000003" in line and "1 steps trained again" in line
               for line in said), said
    lines = [format_line(step, metrics) for step, metrics in enumerate(result.history, start=1)]
    assert "trainer restarts 2" in lines[4] and "trainer restarts" not in lines[3]


def test_out_of_restarts_or_without_checkpoints_the_death_ends_the_run_naming_it(tmp_path):
    with pytest.raises(TrainerWorkerDiedError, match="call 6"):
        run_with(tmp_path / "a", DyingTrainer(deaths={5, 6}), restarts=1)
    trainer = DyingTrainer(deaths={2})
    with pytest.raises(TrainerWorkerDiedError, match="call 2"):  # nothing bounds what a restart would train again
        run_with(tmp_path / "b", trainer, restarts=3, every=0)
    assert trainer.restarts == 0


class AnsweringLikeRay(SimulatedEngine):
    """A simulated engine whose calls raise its death once it is declared dead, as a Ray engine's do."""

    async def version(self) -> int:
        if self.death is not None:
            raise self.death
        return await super().version()


def test_a_run_handed_an_engine_that_died_before_it_started_restarts_it_and_trains(tmp_path):
    """Engines kept across runs (a run stopped by SIGTERM just after a push broke on an engine): the next run
    starts on them, restarts the dead one serving the current version, and trains its steps."""
    async def main():
        _, trainer, _ = parts()
        engines = [AnsweringLikeRay(f"sim-{i}", DecodeCost(max_num_seqs=16, push_s=0.1)) for i in range(2)]
        service = RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))
        engines[0].mark_dead("its actor died during install")  # the first engine: the one the run asked before
        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=Harness(),
                             settings=run_settings(total_steps=4, restart_engines=True, engine_probe_interval_s=1.0),
                             sink=MetricsSink(tmp_path / "metrics.jsonl"))
        result = await run.execute(rows())
        return result, engines, run.weight_sync

    result, engines, sync = run_virtual(main)
    assert result.steps == 4 and sync.restarts == 1
    assert all(engine.death is None for engine in engines)


class DyingInPush(AnsweringLikeRay):
    """An engine whose process dies half-way through installing `version`, as a push broken by a kill leaves it."""

    def __init__(self, name: str, cost: DecodeCost, version: int) -> None:
        super().__init__(name, cost)
        self.dies_at = version

    async def update_weights(self, weights, version: int) -> None:
        if version == self.dies_at:
            self.mark_dead("its actor died during install")
            raise self.death
        await super().update_weights(weights, version)


def test_a_run_whose_last_push_kills_an_engine_hands_it_back_restarted_serving_the_last_version(tmp_path):
    """The supervisor probes too rarely to see the death before the run ends: the run's end restarts it."""
    async def main():
        _, trainer, _ = parts()
        cost = DecodeCost(max_num_seqs=16, push_s=0.1)
        engines = [AnsweringLikeRay("sim-0", cost), DyingInPush("sim-1", cost, version=4)]
        service = RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))
        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=Harness(),
                             settings=run_settings(total_steps=4, restart_engines=True, engine_probe_interval_s=1e6),
                             sink=MetricsSink(tmp_path / "metrics.jsonl"))
        result = await run.execute(rows())
        return result, engines, run.weight_sync, [await engine.version() for engine in engines]

    result, engines, sync, versions = run_virtual(main)
    assert result.steps == 4 and sync.restarts == 1
    assert all(engine.death is None for engine in engines) and versions == [4, 4]


def test_a_dead_engines_error_raised_to_every_caller_keeps_a_traceback_of_its_own_size():
    """Every request routed while an engine is dead gets its death; the kept error gathers no frames."""
    import traceback

    from fullasync.engines.router import EngineRouter
    from fullasync.errors import EngineDiedError

    async def main():
        engine = SimulatedEngine("sim-0", DecodeCost())
        engine.mark_dead("its actor is gone")
        router = EngineRouter([engine])
        depths = []
        for i in range(50):
            with pytest.raises(EngineDiedError, match="sim-0 is dead") as raised:
                router.pick(f"episode-{i}")
            depths.append(len(traceback.extract_tb(raised.value.__traceback__)))
        await engine.shutdown()
        return depths, engine.death

    depths, death = run_virtual(main)
    assert set(depths) == {depths[0]} and death.__traceback__ is None
