"""The curriculum (`data.curriculum=pass_rate`): rows sampled by pools of their recent pass rate, its state kept by
the checkpoint so that a resumed run, fed the same results, draws the same rows; and the rollouter settling each
draw as the ledger records the row's outcome (real Rollouter, simulated engine)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from sim_rollouts import checkpoint_midway, rows_through_a_rollouter

from fullasync.rollout.curriculum import Curriculum, CurriculumSettings, pool_of, rows_in_pools
from fullasync.rollout.rollouter import RolloutSettings, RowOutcome

ROWS = [(f"q{i}", {"i": i, "length": 4}) for i in range(10)]
EASY = {0, 1, 2, 3, 4}  # always solved; the others pass every other episode


def result(row, turn: int) -> list[float]:
    return [1.0, 1.0] if row["i"] in EASY else [float(turn % 2), float((turn + 1) % 2)]


def drive(curriculum: Curriculum, draws: int, settle_every: int = 1) -> list[str]:
    """Draw `draws` rows, settling each (with its row's results) `settle_every` draws later; the draw ids."""
    ids, waiting = [], []
    stream = iter(curriculum)
    for turn in range(draws):
        draw_id, row = next(stream)
        ids.append(draw_id)
        waiting.append((draw_id, row))
        if len(waiting) >= settle_every:
            settled_id, settled_row = waiting.pop(0)
            curriculum.settle(settled_id, result(settled_row, turn))
    return ids


def test_rows_always_solved_are_drawn_less_and_every_pool_keeps_its_floor():
    curriculum = Curriculum(ROWS, CurriculumSettings(draws=3000, seed=1))
    ids = drive(curriculum, 3000)
    assert curriculum.pool_sizes() == {"unseen": 0, "learning": 5, "solved": 5, "unsolved": 0}
    easy = sum(draw_id.split("#")[0] in {f"q{i}" for i in EASY} for draw_id in ids[200:])
    # solved rows weigh 0.2 against the learning ones' 1.0: 1/6 of the draws expected (± 0.007 SE over 2800)
    assert abs(easy / 2800 - 1 / 6) < 0.04
    assert len(set(ids)) == 3000 and ids[0].endswith("#0")  # each draw an id of its own

    starved = Curriculum(ROWS, CurriculumSettings(weights={"unseen": 1.0, "learning": 1.0, "solved": 0.0},
                                                  floor=0.1, draws=3000, seed=2))
    ids = drive(starved, 3000)
    easy = sum(draw_id.split("#")[0] in {f"q{i}" for i in EASY} for draw_id in ids[200:])
    assert abs(easy / 2800 - 0.1 / 1.1) < 0.03  # weight 0: its floor, 0.1 before renormalising


def test_the_samplers_state_survives_a_checkpoint_bit_exactly_and_fed_the_same_results_draws_the_same_rows():
    settings = CurriculumSettings(draws=500, seed=7)
    uninterrupted = Curriculum(ROWS, settings)
    stream = iter(uninterrupted)
    first = [next(stream) for _ in range(3)]  # three draws still running when the checkpoint is taken
    for turn in range(120):
        draw_id, row = next(stream)
        uninterrupted.settle(draw_id, result(row, turn))
    saved = json.loads(json.dumps(uninterrupted.state()))  # as the checkpoint stores it
    resumed = Curriculum(ROWS, settings)
    resumed.restore(saved)
    assert resumed.state() == saved and resumed.rng.getstate() == uninterrupted.rng.getstate()
    again = iter(resumed)
    assert [next(again)[0] for _ in range(3)] == [draw_id for draw_id, _ in first]  # the running draws, first
    for draw_id, row in first:
        uninterrupted.settle(draw_id, result(row, 0))
        resumed.settle(draw_id, result(row, 0))
    later = []
    for turn in range(200):
        (a, row), (b, _) = next(stream), next(again)
        later.append(a == b)
        uninterrupted.settle(a, result(row, turn))
        resumed.settle(b, result(row, turn))
    assert all(later) and uninterrupted.state() == resumed.state()


def test_eval_keeps_the_rows_of_the_pools_asked_for():
    rows = [{"q": i} for i in range(4)]
    rewards = [(1.0, 1.0), (0.0, 0.2), (1.0, 0.0), (0.7, 0.5)]
    assert [pool_of([r >= 0.5 for r in rs]) for rs in rewards] == ["solved", "unsolved", "learning", "solved"]
    assert rows_in_pools(rows, rewards, ["learning", "unsolved"], 0.5) == [{"q": 1}, {"q": 2}]
    assert rows_in_pools(rows, rewards, ["solved"], 0.6) == [{"q": 0}]  # 0.5 no longer passes
    with pytest.raises(ValueError, match=r"eval_keep names \['unseen'\]"):
        rows_in_pools(rows, rewards, ["unseen"], 0.5)


def test_what_a_curriculum_cannot_sample_is_refused_saying_why():
    with pytest.raises(ValueError, match=r"name pools \['easy'\]"):
        CurriculumSettings(weights={"easy": 1.0})
    with pytest.raises(ValueError, match="one of them > 0"):
        CurriculumSettings(weights={"unseen": 0.0})
    with pytest.raises(ValueError, match="the curriculum floor must be in"):
        CurriculumSettings(floor=0.5)
    saved = Curriculum(ROWS, CurriculumSettings(draws=5)).state()
    with pytest.raises(ValueError, match="sampled 10 rows, this dataset has 3: resume with the dataset"):
        Curriculum(ROWS[:3], CurriculumSettings(draws=5)).restore(saved)


async def by_row(client, row) -> float:
    await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=row["length"],
                                    extra_body={"ignore_eos": True})
    return 1.0 if row["i"] in EASY else float(client.episode.id.split("/")[1].split("#")[0] == "0")


def test_the_rollouter_settles_every_draw_with_its_groups_rewards_and_its_checkpoint_holds_the_sampler():
    settings = RolloutSettings(n=2, max_running_rows=4, episode_timeout_s=1e6)
    curriculum = Curriculum(ROWS, CurriculumSettings(draws=60, seed=3))
    rollouter, groups = rows_through_a_rollouter(by_row, settings, curriculum)
    assert len(rollouter.outcomes) == 60 and set(rollouter.outcomes.values()) == {RowOutcome.QUEUED}
    assert not curriculum.pending  # every draw settled as its outcome was recorded
    assert curriculum.pool_sizes() == {"unseen": 0, "learning": 5, "solved": 5, "unsolved": 0}
    assert rollouter.snapshot().curriculum == curriculum.state()
    assert rollouter.report().curriculum_pools == curriculum.pool_sizes()  # the step's rollout/curriculum/<pool>
    drawn = Counter(group.row_id.split("#")[0] for group in groups)
    assert sum(drawn[f"q{i}"] for i in EASY) < sum(drawn[f"q{i}"] for i in set(range(10)) - EASY)


def test_a_resumed_rollouter_runs_the_checkpoints_unsettled_draws_first_then_draws_on_from_its_state():
    settings = RolloutSettings(n=2, max_running_rows=4, episode_timeout_s=1e6)
    sampler = CurriculumSettings(draws=40, seed=4)
    saved = checkpoint_midway(by_row, settings, Curriculum(ROWS, sampler), after_outcomes=12)
    assert saved.curriculum is not None and saved.curriculum["pending"]  # draws running when it was taken
    unsettled = set(saved.curriculum["pending"])
    resumed = Curriculum(ROWS, sampler)
    rollouter, _ = rows_through_a_rollouter(by_row, settings, resumed, restore=saved)
    assert len(rollouter.outcomes) == 40 and not resumed.pending  # the run's 40 draws, each accounted once
    assert unsettled <= set(rollouter.outcomes) and set(saved.outcomes) <= set(rollouter.outcomes)
    assert all(rollouter.outcomes[draw_id] is RowOutcome.QUEUED for draw_id in unsettled)
    assert resumed.drawn == 40
