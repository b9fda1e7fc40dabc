"""The built-in task: single-digit sums `a + b =` with a checkable answer.

Owns: the deterministic train/held-out split, the prompt, the reward, and the `rollout_fn`
that `fullasync train` uses by default. Held-out rows are never used for training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

SYSTEM_PROMPT = "Answer with the number only."


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

    def rows(self, split: str) -> list[dict[str, Any]]:
        """Rows of `split` ("train" or "val"): dicts with id, question and answer."""
        return [{"id": f"{a}+{b}", "question": f"{a} + {b} =", "answer": a + b} for a, b in self.pairs(split)]


def messages(row: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]


def reward(text: str | None, answer: int) -> float:
    """1.0 when the reply is exactly the right number, else 0.0."""
    return 1.0 if (text or "").strip() == str(answer) else 0.0


async def rollout_fn(client: Any, row: dict[str, Any]) -> float:
    """One episode: ask, read the number, score it."""
    response = await client.chat.completions.create(model="policy", messages=messages(row), max_tokens=4)
    return reward(response.choices[0].message.content, row["answer"])
