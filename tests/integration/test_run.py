"""The run as one assembled, supervised whole: contracts, start-up checks, crashes, validation, row accounting.

The control code is real (Rollouter, StalenessManager, MessageQueue, WeightSync, TrainingLoop, Run);
engines and trainer are the simulator's, on its virtual clock, so a run takes no real time. The one
edge fake is a queue whose `put` fails for one row.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging

import pytest

from fullasync.api import AsyncAgentTrainer
from fullasync.client import ClientConfig, RolloutService
from fullasync.config import DataSection, RunConfig
from fullasync.contracts.run import GroupQueue, Trainer
from fullasync.errors import EngineDiedError
from fullasync.infra.heap import GC_THRESHOLDS, settled_heap
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.generator import as_generator
from fullasync.rollout.rollouter import RolloutCrashedError, Rollouter, RolloutSettings
from fullasync.rollout.staleness import StalenessManager
from fullasync.run.assemble import assemble
from fullasync.run.queue import MessageQueue, RayGroupQueue
from fullasync.run.runner import Run, RunParts, RunSettings
from fullasync.run.validation import Evaluation
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer
from fullasync.sim.trainer import SimulatedTrainer, TrainCost
from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.weights.sync import WeightSync

COST = DecodeCost(max_num_seqs=16, push_s=0.1)


def simulated_parts() -> tuple[list[SimulatedEngine], SimulatedTrainer, RolloutService]:
    engines = [SimulatedEngine("sim-0", COST)]
    service = RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))
    return engines, SimulatedTrainer(TrainCost(1e-3, 0.5), 1), service


async def answer(client, row) -> float:
    await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=row["length"],
                                    extra_body={"ignore_eos": True})
    return float(client.episode.id.endswith("/0"))


def rows(count: int, length: int = 40):
    return ((f"row-{i}", {"length": length}) for i in range(count))


def settings(total_steps: int, **overrides) -> RunSettings:
    fields = dict(max_staleness=1, batch_size=2, total_steps=total_steps, queue_in_process=True,
                  rollout=RolloutSettings(n=2, max_running_rows=4, episode_timeout_s=1e6), val_samples_per_row=2)
    fields.update(overrides)
    return RunSettings(**fields)


def test_components_satisfy_their_contracts(ray_cluster):
    assert isinstance(VerlTrainer("/nonexistent", TrainerConfig()), Trainer)  # not started: the shape is checked
    assert isinstance(SimulatedTrainer(TrainCost(1e-3, 0.1), 1), Trainer)
    assert isinstance(MessageQueue(4), GroupQueue)
    queue = RayGroupQueue(4)
    try:
        assert isinstance(queue, GroupQueue)
    finally:
        queue.shutdown()


async def test_the_queue_actor_takes_groups_back_past_its_capacity_and_hands_them_over_oldest_first(ray_cluster):
    """A step that binds its last groups late gives back the ones it did not take (`MessageQueue.give_back`),
    through the actor: at once, even when the rollouter filled the room meanwhile."""
    from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

    def group(row_id: str, version: int) -> TrajectoryGroup:
        call = ModelCall((1,), (2,), (-1.0,), (version,), FinishReason.STOP)
        return TrajectoryGroup(row_id, (Trajectory((call,), 1.0),))

    queue = RayGroupQueue(2)
    try:
        for row_id, version in (("a", 1), ("b", 2)):
            await queue.put(group(row_id, version))
        taken = await queue.get(2, 2, 1, 1.0)
        for row_id, version in (("c", 2), ("d", 2)):
            await queue.put(group(row_id, version))  # full again
        await asyncio.wait_for(queue.give_back([taken.groups[0]]), 10)
        stats = await queue.stats()
        assert (stats.size, stats.total_put, stats.total_got) == (3, 4, 1)
        assert [g.row_id for g in (await queue.get(3, 2, 1, 1.0)).groups] == ["a", "c", "d"]
    finally:
        queue.shutdown()


def test_a_sync_rollout_fn_is_refused_at_start_up():
    def rollout_fn(client, row):  # forgot `async`
        return 1.0

    with pytest.raises(TypeError, match="not an async function: define it as `async def rollout_fn"):
        AsyncAgentTrainer(RunConfig(data=DataSection(task="")), rollout_fn=rollout_fn, train_dataset=[{"q": 1}])


def test_the_trainer_takes_a_group_reward_fn_by_argument_or_by_its_dotted_path(tmp_path, monkeypatch):
    async def ranked(row, trajectories):
        return [0.0] * len(trajectories)

    (tmp_path / "my_scorer.py").write_text("async def score(row, trajectories):\n"
                                           "    return [0.0] * len(trajectories)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = AsyncAgentTrainer(RunConfig(), rollout_fn=answer, train_dataset=[{"length": 1}],
                                group_reward_fn=ranked)
    assert trainer.generator.scores_groups and trainer.generator.group_reward_fn is ranked
    config = RunConfig()
    config.data.group_reward_fn = "my_scorer:score"
    trainer = AsyncAgentTrainer(config, rollout_fn=answer, train_dataset=[{"length": 1}])
    assert trainer.generator.scores_groups and trainer.generator.group_reward_fn.__module__ == "my_scorer"
    config.data.group_reward_fn = "my_scorer:no_such_function"
    with pytest.raises(ValueError, match="data.group_reward_fn='my_scorer:no_such_function' could not be resolved"):
        AsyncAgentTrainer(config, rollout_fn=answer, train_dataset=[{"length": 1}])


def test_the_trainer_takes_models_beside_the_policy_from_its_config_and_its_arguments():
    from fullasync.client.beside import RemoteModel

    config = RunConfig()
    config.beside = {"judge": {"base_url": "http://127.0.0.1:8001/v1", "model": "j", "max_concurrency": "2"}}
    given = RemoteModel("http://127.0.0.1:8002/v1", "r", role="reward_model")
    trainer = AsyncAgentTrainer(config, rollout_fn=answer, train_dataset=[{"length": 1}], beside={"rm": given})
    assert trainer.beside == {"judge": RemoteModel("http://127.0.0.1:8001/v1", "j", max_concurrency=2), "rm": given}
    config.beside = {"judge": {"base_url": "http://127.0.0.1:8001/v1", "model": "j", "role": "critic"}}
    with pytest.raises(ValueError, match="has a role of"):  # before anything starts
        AsyncAgentTrainer(config, rollout_fn=answer, train_dataset=[{"length": 1}])


class TrainerThatKeepsRewards(SimulatedTrainer):
    """Edge fake: the simulator's trainer, keeping the rewards of every group it trained, by row."""

    def __init__(self) -> None:
        super().__init__(TrainCost(1e-3, 0.5), 1)
        self.rewards: dict[str, list[float]] = {}

    def build_batch(self, groups):
        for group in groups:
            self.rewards[group.row_id] = [t.reward for t in group.trajectories]
        return super().build_batch(groups)


def test_group_rewards_reach_the_trainer_in_the_groups_order(tmp_path):
    async def by_index(client, row) -> float:
        await answer(client, row)
        return float(client.episode.id.split("/")[1])

    async def reversed_ranks(row, trajectories):
        return [10.0 * (len(trajectories) - 1 - t.reward) for t in trajectories]

    async def main() -> tuple[TrainerThatKeepsRewards, object]:
        engines, _, service = simulated_parts()
        trainer = TrainerThatKeepsRewards()
        rollout = RolloutSettings(n=3, max_running_rows=4, episode_timeout_s=1e6)
        run = await assemble(engines=engines, trainer=trainer, service=service,
                             rollout_fn=as_generator(by_index, reversed_ranks),
                             settings=settings(total_steps=3, rollout=rollout), sink=MetricsSink(tmp_path / "m.jsonl"))
        return trainer, await run.execute(rows(40))

    trainer, result = run_virtual(main)
    assert result.steps == 3 and len(trainer.rewards) >= 6
    assert all(rewards == [20.0, 10.0, 0.0] for rewards in trainer.rewards.values())  # the episodes' order


class QueueThatFailsFor(MessageQueue):
    """Edge fake: `put` fails for one row, as a queue actor that died would."""

    def __init__(self, max_size: int, row_id: str) -> None:
        super().__init__(max_size)
        self.row_id = row_id
        self.failed_at: float | None = None

    async def put(self, group) -> None:
        if group.row_id == self.row_id:
            self.failed_at = asyncio.get_running_loop().time()
            raise ConnectionError("the queue actor is gone")
        await super().put(group)


def test_a_row_task_that_raises_inside_queue_put_fails_the_run_naming_the_row(tmp_path):
    async def main() -> tuple[float, RolloutCrashedError]:
        engines, trainer, service = simulated_parts()
        run_settings = settings(total_steps=50)
        weight_sync = WeightSync(engines)
        staleness = StalenessManager(1, 2, 4, version=lambda: weight_sync.version)
        queue = QueueThatFailsFor(run_settings.queue_capacity, "row-3")
        rollouter = Rollouter(answer, service, queue, staleness, run_settings.rollout)
        run = Run(RunParts(rollouter, queue, weight_sync, trainer), run_settings, MetricsSink(tmp_path / "m.jsonl"))
        loop = asyncio.get_running_loop()
        with pytest.raises(RolloutCrashedError) as raised:
            await run.execute(rows(40))
        return loop.time() - queue.failed_at, raised.value, weight_sync.version

    delay, error, steps = run_virtual(main)
    assert "row row-3" in str(error) and "the queue actor is gone" in str(error)
    assert delay == 0.0  # noticed at once (the run watches the rollouter), not at the loop's next read of the queue
    assert steps < 50  # the run stopped at the crash: it did not go on to its 50 steps


def test_an_engine_declared_dead_without_restarts_ends_the_run_at_once_naming_it(tmp_path):
    """The weight sync's supervisor hears of the death as it is declared and the run awaits it beside the loop: the
    run ends at that instant of the virtual clock (no poll in between), whatever the loop is doing. Observers hear
    every version the sync published."""
    async def main():
        engines, trainer, service = simulated_parts()
        run_settings = settings(total_steps=500, engine_probe_interval_s=0.5)
        weight_sync = WeightSync(engines)
        staleness = StalenessManager(1, 2, 4, version=lambda: weight_sync.version)
        queue = MessageQueue(run_settings.queue_capacity)
        rollouter = Rollouter(answer, service, queue, staleness, run_settings.rollout)
        run = Run(RunParts(rollouter, queue, weight_sync, trainer), run_settings, MetricsSink(tmp_path / "m.jsonl"))
        heard: list[int] = []
        weight_sync.observe(heard.append)
        loop = asyncio.get_running_loop()
        died_at: list[float] = []

        def kill() -> None:
            died_at.append(loop.time())
            engines[0].mark_dead("killed by the test")

        loop.call_later(3.0, kill)
        with pytest.raises(EngineDiedError, match="engine sim-0 is dead: killed by the test") as raised:
            await run.execute(rows(400))
        return loop.time() - died_at[0], heard, weight_sync.version, raised.value

    delay, heard, version, _ = run_virtual(main)
    assert delay == 0.0  # at the death itself: not a probe interval (0.5 s), a step or a queue wait later
    assert heard == list(range(1, version + 1)) and version >= 1  # every published version, in order
    assert version < 500


def test_validation_runs_with_nothing_generating_and_reports_failed_episodes(tmp_path, caplog):
    async def main():
        engines, trainer, service = simulated_parts()
        loop = asyncio.get_running_loop()
        spans: dict[str, list[tuple[float, float]]] = {"train": [], "val": []}

        async def harness(client, row) -> float:
            kind = "val" if client.episode.id.startswith("val-") else "train"
            if kind == "val" and row["length"] == 13 and client.episode.id.endswith("-0"):
                raise ValueError("the held-out tool is broken")
            start = loop.time()
            reward = await answer(client, row)
            spans[kind].append((start, loop.time()))
            return reward

        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=harness,
                             settings=settings(total_steps=3, val_every=2), sink=MetricsSink(tmp_path / "m.jsonl"),
                             val_rows=[{"length": 20}, {"length": 13}])
        result = await run.execute(rows(40))
        return result, spans

    with caplog.at_level(logging.INFO, logger="fullasync"):
        result, spans = run_virtual(main)
    assert result.steps == 3 and result.val_before is not None and result.val_after is not None
    # the start-up line a user reads (and `fullasync train` on a terminal shows) names the built-in measure
    assert f"held-out accuracy before training: {result.val_before:.3f} (± " in caplog.text
    assert result.val_failed_episodes == 3  # once per validation: before, at step 2, after
    assert "val/accuracy" in result.history[1]
    first_val_end = min(end for _, end in spans["val"])
    last_val_before = max(end for start, end in spans["val"] if start <= first_val_end)
    assert min(start for start, _ in spans["train"]) >= last_val_before  # "before" ran with nothing generating


def test_an_evaluation_of_the_users_own_is_recorded_before_during_and_after_with_its_error(tmp_path, caplog):
    async def main():
        engines, trainer, service = simulated_parts()
        calls: list[int] = []

        async def evaluate_fn(served) -> Evaluation:
            assert served is service
            client = served.client(f"eval-{len(calls)}")
            try:
                await answer(client, {"length": 20})  # episodes on the run's engines, not trained
            finally:
                client.close()
            calls.append(run.loop.result.steps)
            return Evaluation(score=0.25 * len(calls), stderr=0.01 * len(calls), metrics={"exact_match": 0.5})

        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=answer,
                             settings=settings(total_steps=3, val_every=2), sink=MetricsSink(tmp_path / "m.jsonl"),
                             evaluator=evaluate_fn)
        return await run.execute(rows(40)), calls

    with caplog.at_level(logging.INFO, logger="fullasync"):
        result, calls = run_virtual(main)
    assert "held-out score before training: 0.250 (± 0.010)" in caplog.text  # the user's own score, not "accuracy"
    assert calls == [0, 2, 3]  # before training, at step 2 (val_every), after the last step
    assert (result.val_before, result.val_after) == (0.25, 0.75)
    assert [v["step"] for v in result.validations] == [0, 2, 3]
    written = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert written == [{"step": s, "score": 0.25 * n, "stderr": 0.01 * n, "failed": 0.0, "exact_match": 0.5}
                       for n, s in enumerate([0, 2, 3], start=1)]
    summary = result.summary()
    assert summary["val_before_stderr"] == 0.01 and summary["val_after_stderr"] == 0.03


def test_every_admitted_row_is_accounted_for_when_total_steps_ends_the_run(tmp_path):
    async def main():
        engines, trainer, service = simulated_parts()
        started: list[str] = []

        async def harness(client, row) -> float:
            started.append(client.episode.id.split("/")[0])
            return await answer(client, row)

        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=harness,
                             settings=settings(total_steps=2, max_staleness=2), sink=MetricsSink(tmp_path / "m.jsonl"))
        return await run.execute(rows(100, length=400)), set(started)

    result, started = run_virtual(main)
    assert set(result.row_outcomes) == started  # every row that generated anything has an outcome
    assert result.outcomes["trained"] == 4
    assert result.outcomes.get("unfinished", 0) > 0  # generation cancelled when the run ended
    assert set(result.outcomes) <= {"trained", "queued", "unfinished"}


def test_the_tasks_rows_name_split_each_steps_rewards_and_the_held_out_score(tmp_path, caplog):
    """A mixture's rows name their task: each step's metrics and line, and each held-out line, give its reward."""
    async def main():
        engines, trainer, service = simulated_parts()

        async def harness(client, row) -> float:
            await answer(client, row)
            return 1.0 if row["task"] == "easy" else float(client.episode.id.endswith("/0"))

        mixed = ((f"row-{i}", {"length": 20, "task": "easy" if i % 2 else "hard"}) for i in range(40))
        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=harness,
                             settings=settings(total_steps=3, batch_size=4), sink=MetricsSink(tmp_path / "m.jsonl"),
                             val_rows=[{"length": 20, "task": "easy"}, {"length": 20, "task": "hard"}])
        return await run.execute(mixed)

    with caplog.at_level(logging.INFO, logger="fullasync"):
        result = run_virtual(main)
    steps = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(steps) == 3
    for step in steps:
        tasks = {key: value for key, value in step.items() if key.startswith("reward/task/")}
        assert tasks.get("reward/task/easy", 1.0) == 1.0 and tasks.get("reward/task/hard", 0.5) == 0.5 and tasks
    assert "reward/task/hard" in json.dumps(steps)
    assert "(easy 1.00 hard 0.50) | staleness" in caplog.text  # the step line names them
    assert result.validations[0]["task/easy"] == 1.0 and result.validations[0]["task/hard"] == 0.0  # ids val-*
    assert "held-out accuracy before training: 0.500 (± 0.500) (easy 1.000 hard 0.000)" in caplog.text


def test_a_run_tunes_the_garbage_collector_and_gives_it_back_even_when_it_fails():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="the run failed"):
        with settled_heap():
            assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
            raise RuntimeError("the run failed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_settled_heap_inside_another_leaves_the_outer_one_settled():
    before = gc.get_threshold()
    with settled_heap():
        frozen = gc.get_freeze_count()
        # frozen objects still die by reference counting (another thread's, at any time): the count may fall a
        # little; an inner block that gave the heap back would drop it to 0
        with settled_heap():  # e.g. an evaluation started by a program that is running one
            assert gc.get_threshold() == GC_THRESHOLDS and 0.99 * frozen <= gc.get_freeze_count() <= frozen
        assert gc.get_threshold() == GC_THRESHOLDS and 0.99 * frozen <= gc.get_freeze_count() <= frozen
        assert frozen > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
