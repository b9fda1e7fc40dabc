"""On-policy distillation without a model: a teacher engine whose log-prob of each token is a known function of its
context, the scorer that puts them on the calls (every lineage once, a dead engine waited for), and the advantages
`build_batch` trains on, computed again here from the groups alone: w_kl · (log p_teacher − log p_behaviour) +
w_task · the group-relative task advantage, for sync episodes, fully-async partial rollouts (tokens of two
versions, resumed calls) and episodes of several lineages."""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import Counter

import numpy as np
import pytest

from fullasync.contracts.engine import GenerateRequest, GenerateResult, Mortal
from fullasync.errors import EngineDiedError
from fullasync.observe.metrics import teacher_stats
from fullasync.rollout.teacher import TeacherError, TeacherScorer
from fullasync.trainer.batch import Distillation, build_batch
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup, group_from_dict, group_to_dict


def teacher_logprob(context, token) -> float:
    """The fake teacher's log-prob of `token` after `context`: depends on both, so a misaligned score shows."""
    return -((token * 31 + len(context) * 7 + context[-1]) % 50 + 1) / 10


class TeacherEngine(Mortal):
    """Answers scoring requests with `teacher_logprob`; `die_on`: the requests (counted from 0) it dies under,
    coming back `revive_s` later as a restarted engine does."""

    name = "teacher-0"
    workers = 1
    kv_tokens = None

    def __init__(self, die_on=(), revive_s=0.05) -> None:
        self.requests: list[GenerateRequest] = []
        self.die_on, self.revive_s = set(die_on), revive_s

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        assert request.sampling.score_prompt and request.max_tokens == 1
        self.requests.append(request)
        if len(self.requests) - 1 in self.die_on:
            self.death = EngineDiedError("killed by the test")
            asyncio.get_running_loop().call_later(self.revive_s, setattr, self, "death", None)
            raise self.death
        ids = request.prompt_ids
        return GenerateResult(request.request_id, (7,), (-1.0,), (0,), FinishReason.LENGTH,
                              prompt_logprobs=tuple(teacher_logprob(ids[:i], ids[i]) for i in range(1, len(ids))))


def call(prompt, output, versions=None, resumes=0):
    versions = versions or [0] * len(output)
    logprobs = tuple(-0.2 - 0.03 * ((token * 13 + i) % 17) for i, token in enumerate(output))
    return ModelCall(tuple(prompt), tuple(output), logprobs, tuple(versions), FinishReason.STOP, num_resumes=resumes,
                     resubmitted_tokens=2 * resumes)


def sync_groups():
    """Two rows of single-call episodes sampled under one version (sync)."""
    return [TrajectoryGroup(f"row-{g}", tuple(Trajectory((call([1, 2 + g, 3], [10 + i + g, 20, 30 + i][: 2 + i]),),
                                                        reward=float(i % 2 + g)) for i in range(3)))
            for g in range(2)]


def partial_groups():
    """Fully-async partial rollouts: calls a push interrupted (tokens of versions 3 then 4, resumed by the client)
    and two-call episodes whose second prompt inserts a tool result."""
    first = call([5, 6], [40, 41, 42, 43], versions=[3, 3, 4, 4], resumes=1)
    second = call([5, 6, 40, 41, 42, 43, 90, 91], [44, 45], versions=[4, 4])
    other = call([5, 6], [46, 47, 48], versions=[4, 4, 4])
    return [TrajectoryGroup("row-p", (Trajectory((first, second), reward=1.0), Trajectory((other,), reward=0.0),
                                      Trajectory((call([5, 6], [49], versions=[3]),), reward=0.5)))]


def lineage_groups():
    """Episodes of several lineages: a parent and its sub-agent interleaved (A1, B1, A2) and a compacted context."""
    a1 = call([1, 2, 3], [50, 51])
    b1 = call([8, 9], [60, 61, 62])  # a sub-agent: its own context
    a2 = call([1, 2, 3, 50, 51, 70], [52, 53])
    compacted = call([4, 50, 52], [54])  # the parent's context rewritten: a new lineage
    return [TrajectoryGroup("row-l", (Trajectory((a1, b1, a2, compacted), reward=1.0),
                                      Trajectory((call([1, 2, 3], [55, 56, 57]),), reward=0.0)))]


def expected_calls(trajectory: Trajectory, distill: Distillation, task_advantage: float) -> list[list[float]]:
    """Each call's per-token advantage from its own context, not from the trained sequences."""
    rows = []
    for c in trajectory.calls:
        gaps = [teacher_logprob(c.prompt_ids + c.output_ids[:j], token) - c.output_logprobs[j]
                for j, token in enumerate(c.output_ids)]
        rows.append([distill.task_weight * task_advantage + distill.kl_weight * gap for gap in gaps])
    return rows


def grpo(rewards):
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]


@pytest.mark.parametrize("groups", [sync_groups, partial_groups, lineage_groups])
@pytest.mark.parametrize("distill", [Distillation(kl_weight=1.0, task_weight=0.0),
                                     Distillation(kl_weight=0.5, task_weight=2.0)])
async def test_each_sampled_tokens_advantage_is_the_teachers_gap_plus_the_task_advantage(groups, distill):
    scorer = TeacherScorer("teacher", [TeacherEngine()])
    scored = [await scorer.score_group(g) for g in groups()]
    batch = build_batch(scored, distill=distill)
    trajectories = [t for g in scored for t in g.trajectories]
    task = [a for g in scored for a in grpo([t.reward for t in g.trajectories])]
    seen, rows_of = 0, Counter()
    for row in range(batch.num_sequences):
        number = int(batch.trajectory_index[row])
        trajectory = trajectories[number]
        lineage = trajectory.lineages()[rows_of[number]]  # a trajectory's rows: its lineages, in order
        rows_of[number] += 1
        per_call = expected_calls(trajectory, distill, task[number])
        expected = [value for index in lineage for value in per_call[index]]
        trained = batch.advantages[row][batch.response_mask[row].bool()].tolist()
        assert trained == pytest.approx(expected, abs=1e-5)
        assert not batch.advantages[row][~batch.response_mask[row].bool()].any()  # inserted tokens, padding: none
        seen += len(expected)
    assert seen == sum(len(c.output_ids) for t in trajectories for c in t.calls)  # every sampled token, once
    assert scorer.stats.sequences == sum(len(t.lineages()) for t in trajectories)


async def test_without_a_teacher_the_batch_trains_the_task_advantage_alone_and_a_half_scored_batch_is_refused():
    plain = build_batch(sync_groups(), distill=Distillation(kl_weight=1.0, task_weight=0.0))
    assert plain.advantages.abs().max() > 0  # task_weight applies only beside a teacher's term
    scored = await TeacherScorer("teacher", [TeacherEngine()]).score_group(sync_groups()[0])
    with pytest.raises(ValueError, match="3 of 6 sequences of the batch carry a teacher's log-probs"):
        build_batch([scored, sync_groups()[1]])


async def test_an_engine_dying_under_a_score_is_waited_for_and_each_sequence_is_scored_once():
    engine = TeacherEngine(die_on={1, 2})
    scorer = TeacherScorer("teacher", [engine], backoff_s=0.01)
    (group,) = lineage_groups()
    scored = await scorer.score_group(group)
    assert scorer.stats.retries == 2 and len(engine.requests) == 4 + 2  # 3 + 1 lineages, two sent again
    assert scorer.stats.sequences == 4 and scorer.metrics()["teacher/sequences"] == 4
    for trajectory in scored.trajectories:
        for c in trajectory.calls:
            assert c.teacher_logprobs == pytest.approx(
                [teacher_logprob(c.prompt_ids + c.output_ids[:j], t) for j, t in enumerate(c.output_ids)])
    with pytest.raises(ValueError, match="scored once"):
        await scorer.score_trajectory(scored.trajectories[0])
    assert group_from_dict(group_to_dict(scored)) == scored  # a checkpoint keeps the scores
    kl = teacher_stats([scored])
    gaps = [lp - tl for t in scored.trajectories for c in t.calls
            for lp, tl in zip(c.output_logprobs, c.teacher_logprobs, strict=True)]
    assert kl["teacher/kl"] == pytest.approx(math.fsum(gaps) / len(gaps)) and kl["teacher/scored_tokens"] == len(gaps)


async def test_a_teacher_whose_engines_are_not_coming_back_fails_the_run_saying_so():
    gave_up = TeacherScorer("teacher", [TeacherEngine()], check=lambda: (_ for _ in ()).throw(
        RuntimeError("engine teacher-0 failed 3 restarts")))
    with pytest.raises(TeacherError, match="its engines could not be restarted"):
        await gave_up.score([1, 2, 3])
    engine = TeacherEngine(die_on={0}, revive_s=60)
    scorer = TeacherScorer("teacher", [engine], backoff_s=0.01, restart_wait_s=0.1)
    with pytest.raises(TeacherError, match="no engine of it came back within"):
        await scorer.score([1, 2, 3])
    assert np.isclose(scorer.metrics()["teacher/tokens"], 0)
