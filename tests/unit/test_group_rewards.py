"""Group rewards: a row's episodes scored together (`group_reward_fn`, `CustomGenerator.group_rewards`) before the
group is queued.

The control code is real (Rollouter, its ledger and failure log, StalenessManager, MessageQueue); the engine is the
simulator's. The scorers are the test's: one that ranks, one that fails a set number of times, one that hangs, one
that answers malformed.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from sim_rollouts import rows_through_a_rollouter

from fullasync.errors import FailureKind
from fullasync.rollout.generator import CustomGenerator, FunctionGenerator, as_generator
from fullasync.rollout.group_rewards import GROUP_SCORING
from fullasync.rollout.rollouter import RolloutSettings, RowOutcome

N = 4


async def by_index(client, row) -> float:
    """An episode whose own reward is its index in the row (0 .. N-1), so the scorer can see the order."""
    await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=4 + row["length"],
                                    extra_body={"ignore_eos": True})
    return float(client.episode.id.split("/")[1].split("#")[0])


async def ranked(row, trajectories) -> list[float]:
    """The group's rewards from the episodes' together: the highest own reward gets 1, the others their rank."""
    own = [t.reward for t in trajectories]
    return [sorted(own).index(reward) / (len(own) - 1) for reward in own]


def run_rows(generator, count: int, settings: RolloutSettings | None = None):
    """`count` rows through a rollouter to their ends: (its outcomes, the queued groups by row, its failure log)."""
    settings = settings or RolloutSettings(n=N, max_running_rows=4, episode_timeout_s=1e6, infra_retries=2)
    rollouter, groups = rows_through_a_rollouter(generator, settings,
                                                 ((f"row-{i}", {"length": i}) for i in range(count)))
    return dict(rollouter.outcomes), {g.row_id: g for g in groups}, rollouter.ledger.failures


def test_group_rewards_reach_the_queue_in_the_groups_order_and_each_keeps_its_episodes_own():
    seen = []

    async def scorer(row, trajectories):
        seen.append([t.reward for t in trajectories])
        return await ranked(row, trajectories)

    outcomes, groups, failures = run_rows(as_generator(by_index, scorer), 6)
    assert outcomes == {f"row-{i}": RowOutcome.QUEUED for i in range(6)} and failures.count == 0
    assert seen == [[0.0, 1.0, 2.0, 3.0]] * 6  # called once per row, the trajectories in episode order
    for group in groups.values():
        assert [t.reward for t in group.trajectories] == pytest.approx([0, 1 / 3, 2 / 3, 1])
        assert [t.metadata["episode_reward"] for t in group.trajectories] == [0.0, 1.0, 2.0, 3.0]


def test_a_scorer_that_fails_is_tried_again_and_counted_as_the_infrastructures():
    calls: dict[str, int] = {}

    async def flaky(row, trajectories):
        key = str(row["length"])
        calls[key] = calls.get(key, 0) + 1
        if calls[key] <= 2:  # fails twice per row, then answers: infra_retries=2 allows it
            raise ConnectionError("the judge is restarting")
        return await ranked(row, trajectories)

    outcomes, groups, failures = run_rows(as_generator(by_index, flaky), 3)
    assert set(outcomes.values()) == {RowOutcome.QUEUED} and len(groups) == 3
    assert calls == {"0": 3, "1": 3, "2": 3}
    assert failures.count == 6 and failures.kinds[FailureKind.INFRA.value] == 6 and failures.infra_retries == 6
    assert all(failure.episode == GROUP_SCORING for failure in failures.recent)


def test_a_scorer_that_keeps_failing_or_hangs_fails_its_row_and_nothing_of_it_is_trained():
    async def broken(row, trajectories):
        raise RuntimeError("judge endpoint answered 500")

    async def hangs(row, trajectories):
        await asyncio.Event().wait()

    outcomes, groups, failures = run_rows(as_generator(by_index, broken), 2)
    assert outcomes == {"row-0": RowOutcome.FAILED, "row-1": RowOutcome.FAILED} and not groups
    assert failures.count == 6 and failures.infra_retries == 4  # 3 tries per row, 2 of them again
    assert failures.reasons == {"RuntimeError": 6} and "judge endpoint answered 500" in failures.recent[-1].error

    settings = RolloutSettings(n=N, max_running_rows=4, episode_timeout_s=60.0, infra_retries=1)
    outcomes, groups, failures = run_rows(as_generator(by_index, hangs), 2, settings)
    assert set(outcomes.values()) == {RowOutcome.FAILED} and not groups
    assert failures.kinds[FailureKind.INFRA.value] == 4 and failures.reasons == {"TimeoutError": 4}


@pytest.mark.parametrize("answer, says", [
    ([1.0, 2.0], "returned 2 reward(s) for 4 trajectories"),
    ([0.0, 1.0, math.nan, 0.0], "reward 2 is nan"),
    ([0.0, True, 0.0, 0.0], "reward 1 is True"),
    ("1234", "must return a sequence of floats"),
])
def test_a_malformed_answer_fails_the_row_at_once_saying_what_is_wrong(answer, says):
    calls = []

    async def malformed(row, trajectories):
        calls.append(row)
        return answer

    outcomes, groups, failures = run_rows(as_generator(by_index, malformed), 1)
    assert outcomes == {"row-0": RowOutcome.FAILED} and not groups
    assert len(calls) == 1 and failures.kinds[FailureKind.HARNESS.value] == 1  # a bug: not tried again
    assert says in failures.recent[-1].error


def test_the_zero_variance_filter_sees_the_group_rewards_not_the_episodes():
    async def all_equal(row, trajectories):
        return [0.5] * len(trajectories)

    settings = RolloutSettings(n=N, max_running_rows=4, episode_timeout_s=1e6, filter_zero_variance=True)
    outcomes, groups, _ = run_rows(as_generator(by_index, all_equal), 2, settings)
    assert outcomes == {"row-0": RowOutcome.FILTERED, "row-1": RowOutcome.FILTERED} and not groups
    outcomes, groups, _ = run_rows(as_generator(by_index, ranked), 2, settings)  # episodes vary, so do the ranks
    assert set(outcomes.values()) == {RowOutcome.QUEUED} and len(groups) == 2


def test_a_generator_that_overrides_group_rewards_scores_groups_and_one_that_does_not_is_untouched():
    class Judged(CustomGenerator):
        async def generate(self, episode, row):
            return await by_index(episode.client, row)

        async def group_rewards(self, row, trajectories):
            return [1.0 - t.reward / 3 for t in trajectories]

    class Plain(Judged):
        group_rewards = CustomGenerator.group_rewards

    assert Judged().scores_groups and not Plain().scores_groups and not FunctionGenerator(by_index).scores_groups
    _, groups, _ = run_rows(Judged(), 1)
    assert [t.reward for t in groups["row-0"].trajectories] == pytest.approx([1, 2 / 3, 1 / 3, 0])
    _, groups, _ = run_rows(Plain(), 1)
    assert [t.reward for t in groups["row-0"].trajectories] == [0.0, 1.0, 2.0, 3.0]
    assert "episode_reward" not in groups["row-0"].trajectories[0].metadata


def test_what_cannot_score_groups_is_refused_before_anything_starts():
    def not_async(row, trajectories):
        return [0.0] * len(trajectories)

    class Judged(CustomGenerator):
        async def generate(self, episode, row):
            return 0.0

        def group_rewards(self, row, trajectories):  # not async
            return None

    with pytest.raises(TypeError, match="group_reward_fn .* is not an async function"):
        as_generator(by_index, not_async)
    with pytest.raises(TypeError, match="override its `async def group_rewards"):
        as_generator(Judged(), ranked)
    with pytest.raises(TypeError, match="Judged.group_rewards must be `async def"):
        as_generator(Judged())


async def solved_by_the_first(client, row) -> float:
    """Episode i of a row passes when i < row["solved"]: the row's mean reward is solved / N."""
    await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=4)
    return float(int(client.episode.id.split("/")[1].split("#")[0]) < row["solved"])


def test_the_reward_range_gate_turns_back_rows_solved_by_nearly_all_or_none_and_frees_their_slots():
    settings = RolloutSettings(n=N, max_running_rows=2, episode_timeout_s=1e6, filter_reward_range=(0.2, 0.8))
    rows = [(f"row-{solved}", {"solved": solved}) for solved in range(N + 1)]  # mean rewards 0, 0.25, ..., 1
    rollouter, groups = rows_through_a_rollouter(as_generator(solved_by_the_first), settings, rows)
    assert dict(rollouter.outcomes) == {"row-0": RowOutcome.FILTERED, "row-1": RowOutcome.QUEUED,
                                        "row-2": RowOutcome.QUEUED, "row-3": RowOutcome.QUEUED,
                                        "row-4": RowOutcome.FILTERED}
    assert sorted(group.row_id for group in groups) == ["row-1", "row-2", "row-3"]
    # a row turned back gave its admission slot to the next row: only the queued groups hold slots
    assert rollouter.staleness.counts.started == 3 and rollouter.staleness.counts.running == 0
    both = RolloutSettings(n=N, max_running_rows=2, episode_timeout_s=1e6, filter_reward_range=(0.0, 0.8),
                           filter_zero_variance=True)
    rollouter, _ = rows_through_a_rollouter(as_generator(solved_by_the_first), both, rows)
    assert [outcome for _, outcome in sorted(rollouter.outcomes.items())] == [RowOutcome.FILTERED] + [
        RowOutcome.QUEUED] * 3 + [RowOutcome.FILTERED]  # row-0: all equal; row-4: mean 1.0 > 0.8


@pytest.mark.parametrize("reward_range", [[0.5], [0.9, 0.1], [0.1, 0.5, 0.9]])
def test_a_reward_range_that_is_not_low_high_is_refused_saying_how(reward_range):
    from fullasync.config import RunConfig

    config = RunConfig()
    config.rollout.filter_reward_range = reward_range
    with pytest.raises(ValueError, match=r"must be \[low, high\] with low <= high"):
        config.validate()
