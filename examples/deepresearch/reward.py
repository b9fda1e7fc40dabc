"""The reward: token F1 / exact match of the normalised `\\boxed{}` answer, minus switchable penalties.

Owns: finding the final boxed answer, SQuAD-style normalisation (lowercase, no punctuation or
articles, single spaces), F1 and exact match against the best of the gold answers, and the
penalties `RewardConfig` switches on (duplicate searches, tool calls beyond the agent's per-turn
limit, tool errors). A reply with no box scores 0. Does not own: running the episode (`agent.py` hands in the
`EpisodeLog` facts this needs).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from fullasync.config import setting

BOX = "\\boxed{"
ARTICLES = re.compile(r"\b(a|an|the)\b")


@dataclass
class RewardConfig:
    metric: str = setting("f1", "f1 | em: what a correct boxed answer earns")
    duplicate_search_penalty: float = setting(0.0, "subtracted per search repeating an earlier query of the episode")
    excess_call_penalty: float = setting(0.0, "subtracted per tool call beyond agent.max_calls_per_turn (those are not "
                                         "run)")
    tool_error_penalty: float = setting(0.0, "subtracted per tool call that failed (bad arguments, unknown tool, ...)")

    def validate(self) -> None:
        if self.metric not in ("f1", "em"):
            raise ValueError(f"reward.metric={self.metric!r} must be 'f1' or 'em'")
        for name in ("duplicate_search_penalty", "excess_call_penalty", "tool_error_penalty"):
            if getattr(self, name) < 0:
                raise ValueError(f"reward.{name}={getattr(self, name)} must be >= 0 (it is subtracted)")


@dataclass(frozen=True)
class AnswerScore:
    boxed: str | None  # the last boxed answer, None when the reply has no box
    f1: float
    exact_match: float


@dataclass(frozen=True)
class RewardBreakdown:
    answer: AnswerScore
    penalty: float
    reward: float


def extract_boxed(text: str | None) -> str | None:
    """Contents of the last `\\boxed{...}` (braces balanced), or None."""
    if not text:
        return None
    start = text.rfind(BOX)
    if start < 0:
        return None
    depth, position = 1, start + len(BOX)
    for index in range(position, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[position:index]
    return None


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    return " ".join(ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if not predicted or not expected or common == 0:
        return float(predicted == expected)
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def score_answer(text: str | None, answers: Sequence[str]) -> AnswerScore:
    """F1 and exact match of the boxed answer against the best gold answer; 0 without a box."""
    if not answers:
        raise ValueError("score_answer needs at least one gold answer")
    boxed = extract_boxed(text)
    if boxed is None:
        return AnswerScore(None, 0.0, 0.0)
    f1 = max(token_f1(boxed, gold) for gold in answers)
    exact = max(float(normalize_answer(boxed) == normalize_answer(gold)) for gold in answers)
    return AnswerScore(boxed, f1, exact)


def compute_reward(config: RewardConfig, final_text: str | None, answers: Sequence[str], duplicate_searches: int,
                   excess_calls: int, tool_errors: int) -> RewardBreakdown:
    answer = score_answer(final_text, answers)
    earned = answer.f1 if config.metric == "f1" else answer.exact_match
    penalty = (config.duplicate_search_penalty * duplicate_searches + config.excess_call_penalty * excess_calls
               + config.tool_error_penalty * tool_errors)
    return RewardBreakdown(answer, penalty, earned - penalty)
