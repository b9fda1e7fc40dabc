"""The built-in task: single-digit sums `a + b =` with a checkable answer.

Owns: the deterministic train/held-out split, the prompt, the reward, and the `rollout_fn`
that `fullasync train` uses by default; and its long-tail variant (`LongTail`: each training answer followed by a
working-out of lognormal length, bench/time_to_score.py's task). Held-out rows are never used for training.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from fullasync.tasks.chat import reply_text

SYSTEM_PROMPT = "Answer with the number only."


class Row(TypedDict):
    id: str
    question: str  # "a + b ="
    answer: int
    tail: NotRequired[bool]  # the long-tail variant: whether to write a working-out


@dataclass(frozen=True)
class ArithmeticTask:
    """Questions `a + b =` over all pairs of non-negative integers with `a + b <= max_sum`."""

    max_sum: int = 9  # largest answer; 9 keeps every answer one token
    held_out_fraction: float = 0.2  # share of the pairs kept for validation only
    seed: int = 0  # fixes the split

    def pairs(self, split: str) -> list[tuple[int, int]]:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        pairs = [(a, b) for a in range(self.max_sum + 1) for b in range(self.max_sum + 1 - a)]
        random.Random(self.seed).shuffle(pairs)
        cut = max(1, int(len(pairs) * self.held_out_fraction))
        return pairs[:cut] if split == "val" else pairs[cut:]

    def rows(self, split: str) -> list[Row]:
        """Rows of `split` ("train" or "val"): dicts with id, question and answer."""
        return [{"id": f"{a}+{b}", "question": f"{a} + {b} =", "answer": a + b} for a, b in self.pairs(split)]


def messages(row: Row) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]


def reward(text: str | None, answer: int) -> float:
    """1.0 when the reply is exactly the right number, else 0.0."""
    return 1.0 if (text or "").strip() == str(answer) else 0.0


def rollout_for(model: str) -> Callable[[object, Row], Coroutine[None, None, float]]:
    """The episode asking `model` (the run's `model.served_name`): ask, read the number, score it."""
    async def rollout_fn(client: object, row: Row) -> float:
        return reward(await reply_text(client, model, messages(row), max_tokens=4), row["answer"])

    return rollout_fn


rollout_fn = rollout_for("policy")  # the episode against the default served name


FILLER = "~"  # the long-tail variant's working-out token (one token of the tiny tokenizer)


def answer_text(text: str | None) -> str:
    """The reply up to its working-out (the long-tail variant writes the answer, then FILLER tokens)."""
    return (text or "").split(FILLER, 1)[0]


@dataclass(frozen=True)
class LongTail:
    """The long-tail variant of the task: each training episode answers and then writes a working-out of L tokens,
    L lognormal (median `median`, σ `sigma`) capped at `cap_factor` × the median — the response lengths of the
    simulator's `long-tail` workload, scaled, so that a batch waits for its longest responses for real. The reward
    is the plain task's, on the text before the working-out; validation rows (`rows("val")`) answer without one.
    Its starting policy is `warmup.LongTailWarmupSpec` (taught to follow its answer with FILLER, no end token)."""

    task: ArithmeticTask = ArithmeticTask()
    median: int = 64
    sigma: float = 1.0
    cap_factor: float = 8.0
    seed: int = 0  # seeds the lengths (drawn in episode order)

    @property
    def cap(self) -> int:
        return int(self.median * self.cap_factor)

    def rows(self, split: str) -> list[Row]:
        """The task's rows, training rows marked to write a working-out."""
        return [{**row, "tail": split == "train"} for row in self.task.rows(split)]

    def length(self, rng: random.Random) -> int:
        return max(1, min(self.cap, round(rng.lognormvariate(math.log(self.median), self.sigma))))

    def rollout_fn(self) -> Callable[..., Coroutine[None, None, float]]:
        """The episode: ask; a training row's reply runs exactly 4 + L tokens (`ignore_eos`); score its answer."""
        rng = random.Random(self.seed)

        async def rollout_fn(client: object, row: Row) -> float:
            tail = self.length(rng) if row.get("tail") else 0
            text = await reply_text(client, "policy", messages(row), max_tokens=4 + tail, ignore_eos=tail > 0)
            return reward(answer_text(text), row["answer"])

        return rollout_fn
