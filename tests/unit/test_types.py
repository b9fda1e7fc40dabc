"""Invariants of the record types and the conversion of trajectories to training sequences."""

from __future__ import annotations

import pytest

from fullasync.contracts.engine import GenerateResult
from fullasync.types import PROMPT_VERSION, FinishReason, ModelCall, TrainingSequence, Trajectory, TrajectoryGroup


def call(prompt, output, versions=None, finish=FinishReason.STOP):
    return ModelCall(
        prompt_ids=tuple(prompt),
        output_ids=tuple(output),
        output_logprobs=tuple(-0.1 * (i + 1) for i in range(len(output))),
        output_versions=tuple(versions if versions is not None else [0] * len(output)),
        finish_reason=finish,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"output_logprobs": (-0.1,)}, "must be aligned"),
        ({"output_versions": (1, 0)}, "non-decreasing"),
        ({"output_versions": (-1, 0)}, ">= 0"),
        ({"prompt_ids": ()}, "prompt_ids is empty"),
        ({"finish_reason": FinishReason.ABORT}, "cannot finish with 'abort'"),
        ({"output_logprobs": (0.5, -0.1)}, "<= 0"),
    ],
)
def test_model_call_rejects_broken_records(kwargs, message):
    fields = dict(prompt_ids=(1, 2), output_ids=(3, 4), output_logprobs=(-0.1, -0.2), output_versions=(0, 1),
                  finish_reason=FinishReason.STOP)
    with pytest.raises(ValueError, match=message):
        ModelCall(**{**fields, **kwargs})


def test_calls_that_extend_merge_into_one_sequence_with_loss_mask():
    first = call([1, 2, 3], [4, 5], versions=[0, 1])
    second = call([1, 2, 3, 4, 5, 9, 9], [6], versions=[2])  # 9, 9: tool result inserted by the environment
    (sequence,) = Trajectory((first, second), reward=1.0).to_sequences()
    assert sequence.token_ids == (1, 2, 3, 4, 5, 9, 9, 6)
    assert sequence.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert sequence.versions == (PROMPT_VERSION,) * 3 + (0, 1) + (PROMPT_VERSION,) * 2 + (2,)
    assert sequence.logprobs == (0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.1)
    assert sequence.prompt_length == 3 and sequence.num_trained_tokens == 3


def test_calls_that_do_not_extend_stay_separate_sequences():
    first = call([1, 2], [3])
    rewritten = call([1, 7], [8])  # the harness rewrote history: no exact extension
    sequences = Trajectory((first, rewritten), reward=0.0).to_sequences()
    assert [s.token_ids for s in sequences] == [(1, 2, 3), (1, 7, 8)]
    assert [s.loss_mask for s in sequences] == [(0, 0, 1), (0, 0, 1)]


def test_trajectory_and_group_validate():
    with pytest.raises(ValueError, match="no model calls"):
        Trajectory((), reward=1.0)
    with pytest.raises(ValueError, match="finite"):
        Trajectory((call([1], [2]),), reward=float("nan"))
    with pytest.raises(ValueError, match="is empty"):
        TrajectoryGroup("row-1", ())
    group = TrajectoryGroup("row-1", (Trajectory((call([1], [2], [3]),), 1.0), Trajectory((call([1], [2], [5]),), 0.0)))
    assert group.rewards == (1.0, 0.0) and group.min_version == 3
    with pytest.raises(TypeError):
        group.metadata["x"] = 1  # records are frozen all the way down


def test_one_alignment_check_names_every_misaligned_array_of_each_record():
    with pytest.raises(ValueError, match=r"ModelCall arrays must be aligned with output_ids .*: 2 output_ids, "
                                         r"1 output_logprobs, 3 output_weight_versions"):
        ModelCall(prompt_ids=(1,), output_ids=(3, 4), output_logprobs=(-0.1,), output_versions=(0, 1),
                  finish_reason=FinishReason.STOP, output_weight_versions=(0, 1, 2))
    with pytest.raises(ValueError, match=r"TrainingSequence arrays .*: 3 token_ids, 2 versions"):
        TrainingSequence(token_ids=(1, 2, 3), loss_mask=(0, 1, 1), logprobs=(0.0, -0.1, -0.2), versions=(-1, 0),
                         prompt_length=1)
    with pytest.raises(ValueError, match=r"GenerateResult arrays .*: 1 output_ids, 2 top_logprobs"):
        GenerateResult(request_id="r", output_ids=(5,), output_logprobs=(-0.1,), output_versions=(0,),
                       finish_reason=FinishReason.STOP, top_logprobs=({5: -0.1}, {6: -0.2}))
    # optional arrays may be left empty: not recorded
    assert GenerateResult(request_id="r", output_ids=(5,), output_logprobs=(-0.1,), output_versions=(0,),
                          finish_reason=FinishReason.STOP).top_logprobs == ()
