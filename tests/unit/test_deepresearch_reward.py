"""examples/deepresearch reward: F1 / exact match of the boxed answer, 0 without a box, switchable penalties."""

from __future__ import annotations

import pytest

from examples.deepresearch.reward import RewardConfig, compute_reward, extract_boxed, normalize_answer, score_answer


@pytest.mark.parametrize("text, boxed", [
    ("\\boxed{midunber}", "midunber"),
    ("first \\boxed{a} then \\boxed{b}", "b"),
    ("\\boxed{x {y} z}", "x {y} z"),
    ("\\boxed{unclosed", None),
    ("the answer is midunber.", None),
    (None, None),
])
def test_extract_boxed(text, boxed):
    assert extract_boxed(text) == boxed


def test_no_box_scores_zero_even_with_the_right_words():
    score = score_answer("the answer is midunber.", ["midunber"])
    assert (score.boxed, score.f1, score.exact_match) == (None, 0.0, 0.0)


def test_exact_match_after_normalisation():
    score = score_answer("so: \\boxed{The Midunber!}", ["midunber"])
    assert (score.f1, score.exact_match) == (1.0, 1.0)
    assert normalize_answer("  The  Kaqui, Taskaka. ") == "kaqui taskaka"


def test_partial_match_gets_token_f1_and_no_exact_match():
    score = score_answer("\\boxed{kaqui rendunka}", ["kaqui taskaka"])
    assert score.f1 == pytest.approx(0.5) and score.exact_match == 0.0
    assert score_answer("\\boxed{kaqui}", ["kaqui taskaka"]).f1 == pytest.approx(2 / 3)


def test_best_of_several_gold_answers_and_wrong_answers():
    assert score_answer("\\boxed{nyc}", ["new york city", "NYC"]).exact_match == 1.0
    assert score_answer("\\boxed{lotasber}", ["midunber"]).f1 == 0.0
    assert score_answer("\\boxed{}", ["midunber"]).f1 == 0.0


def test_penalties_are_off_by_default_and_switchable():
    plain = compute_reward(RewardConfig(), "\\boxed{midunber}", ["midunber"], duplicate_searches=2,
                           excess_calls=1, tool_errors=1)
    assert plain.reward == 1.0 and plain.penalty == 0.0
    config = RewardConfig(duplicate_search_penalty=0.1, excess_call_penalty=0.2, tool_error_penalty=0.05)
    penalised = compute_reward(config, "\\boxed{midunber}", ["midunber"], duplicate_searches=2, excess_calls=1,
                               tool_errors=1)
    assert penalised.penalty == pytest.approx(0.45) and penalised.reward == pytest.approx(0.55)
    exact = compute_reward(RewardConfig(metric="em"), "\\boxed{kaqui}", ["kaqui taskaka"], 0, 0, 0)
    assert exact.reward == 0.0 and exact.answer.f1 > 0


def test_bad_reward_config_names_the_field():
    with pytest.raises(ValueError, match="reward.metric"):
        RewardConfig(metric="bleu").validate()
    with pytest.raises(ValueError, match="reward.duplicate_search_penalty"):
        RewardConfig(duplicate_search_penalty=-1).validate()
