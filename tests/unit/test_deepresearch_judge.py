"""examples/deepresearch judge: its candidates and labels (the example's own F1), its reward_fn (the boxed answer
scored by the run's judge, 0 without a box), and its build on the tiny model end to end (a few steps)."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest
from test_judged_rewards import ScriptedJudge, judge_client

from examples.deepresearch.judge import JudgeSpec, _train, candidate, judged, label
from examples.deepresearch.reward import token_f1
from examples.deepresearch.warmup import WarmupSpec, entity_names
from examples.deepresearch.world import WorldSpec, generate_world, questions
from fullasync.types import ModelCall, Trajectory

SMALL = WorldSpec(people=100, organisations=40, cities=20, countries=4, events=20)


def test_candidates_are_right_wrong_and_partly_right_and_labelled_by_the_examples_f1():
    world = generate_world(SMALL)
    rows = [row for row in questions(world) if row["split"] == "train"]
    rng, names = random.Random(0), entity_names(world)
    scores = Counter()
    for _ in range(400):
        row = rng.choice(rows)
        answer = candidate(row, names, world, rng)
        assert label(row["answer"], answer) == f"score: {round(10 * token_f1(answer, row['answer']))}"
        scores[int(label(row["answer"], answer).split()[1])] += 1
    assert scores[10] > 100 and scores[0] > 100 and sum(n for s, n in scores.items() if 0 < s < 10) > 20


def test_the_reward_is_the_judges_score_of_the_boxed_answer_and_no_box_is_zero_unasked():
    backend = ScriptedJudge("score: 7")
    judge = judge_client(backend)
    row = {"question": "where was kaqui taskaka born?", "answers": ["midunber", "midun"]}

    def episode(boxed):
        call = ModelCall(prompt_ids=(1,), output_ids=(2,), output_logprobs=(-0.1,), output_versions=(0,),
                         finish_reason="stop")
        return Trajectory(calls=(call,), reward=0.0, metadata={"boxed": boxed})

    assert asyncio.run(judged(judge, row, episode(None))) == 0.0 and not backend.asked
    assert asyncio.run(judged(judge, row, episode("midunber"))) == pytest.approx(0.7)
    (request,) = backend.asked
    assert request["messages"][1]["content"] == "Reference: midunber\nAnswer: midunber"
    assert request["temperature"] == 0.0
    assert asyncio.run(judged(judge_client(ScriptedJudge("score: 14")), row, episode("x"))) == 1.0  # clipped


def test_the_judge_builds_on_the_tiny_model_and_records_its_agreement_with_f1(tiny_model_path, tmp_path):
    spec = JudgeSpec(policy=WarmupSpec(world=SMALL), steps=3, batch_size=4, probes=5)
    record = _train(spec, tiny_model_path, tmp_path)
    assert (tmp_path / "model.safetensors").exists() and json.loads((tmp_path / "judge.json").read_text()) == record
    agreement = record["heldout"]
    assert 0 <= agreement["exact"] <= 1 and 0 <= agreement["unreadable"] <= 1 and agreement["mean_abs_error"] >= 0
