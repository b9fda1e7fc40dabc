"""What a generation tells the engine about its interruptions: each resubmission carries how many interruptions in a
row came before a token (`GenerateRequest.starved`, the engine's starvation rule reads it), and the recorded call
and the step's metrics count them."""

from __future__ import annotations

import pytest
from test_stream_interval import ScriptedSegments, streamed

from fullasync.config import RunConfig
from fullasync.contracts.engine import GenerateRequest
from fullasync.observe.metrics import generation_stats
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup, call_from_dict, call_to_dict

ABORT = FinishReason.ABORT


async def test_each_resubmission_counts_the_interruptions_in_a_row_before_a_token():
    router = ScriptedSegments([((), ABORT), ((), ABORT), ((5,), ABORT), ((), ABORT), ((6, 7), FinishReason.LENGTH)])
    _, whole = await streamed(router, interval=1, max_tokens=3)
    assert [request.starved for request in router.requests] == [0, 1, 2, 0, 1]
    assert whole.output_ids == [5, 6, 7] and whole.num_resumes == 4 and whole.starved_resumes == 3


def test_a_recorded_call_keeps_its_starved_resumes_and_the_step_reports_them():
    call = ModelCall((1,), (5, 6, 7, 8), (-0.1,) * 4, (3, 3, 4, 5), FinishReason.LENGTH, num_resumes=3,
                     starved_resumes=2)
    assert call_from_dict(call_to_dict(call)) == call
    plain = ModelCall((1,), (9, 9), (-0.1,) * 2, (5, 5), FinishReason.STOP)
    stats = generation_stats([TrajectoryGroup("r", (Trajectory((call, plain), 1.0),))])
    assert stats["rollout/starved_resumes"] == 2
    assert stats["rollout/tokens_between_interruptions"] == 4 / 4  # the resumed call's 4 tokens in 4 pieces
    with pytest.raises(ValueError, match="starved_resumes"):
        ModelCall((1,), (5,), (-0.1,), (3,), FinishReason.STOP, num_resumes=1, starved_resumes=2)
    with pytest.raises(ValueError, match="starved"):
        GenerateRequest("r", (1,), 4, starved=-1)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("starved_interruptions", -1, "starved_interruptions"), ("starved_interruptions", 1.5, "starved_interruptions"),
    ("starved_wait_s", -1.0, "starved_wait_s"), ("starved_wait_s", float("inf"), "starved_wait_s")])
def test_the_starvation_rule_settings_are_checked(field, value, message):
    config = RunConfig()
    setattr(config.engine, field, value)
    with pytest.raises(ValueError, match=message):
        config.validate()
