"""The built-in task's long-tail variant: its rows, its lengths, its episodes and its starting policy's labels."""

from __future__ import annotations

import asyncio
import random
import statistics
from types import SimpleNamespace

from fullasync.models import build_tiny_model, load_tokenizer
from fullasync.tasks.arithmetic import FILLER, ArithmeticTask, LongTail, answer_text
from fullasync.tasks.warmup import LongTailWarmupSpec, WarmupSpec, _sloppy_label


class RecordingClient:
    """An OpenAI-style client that answers `reply` and keeps each request's keyword arguments."""

    def __init__(self, reply: str) -> None:
        self.requests: list[dict] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))
        self.reply = reply

    async def _create(self, **request):
        self.requests.append(request)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.reply))])


def test_training_rows_write_a_working_out_and_held_out_rows_do_not():
    task = LongTail()
    plain = ArithmeticTask()
    for split in ("train", "val"):
        rows = task.rows(split)
        assert [r["id"] for r in rows] == [r["id"] for r in plain.rows(split)]
        assert {r["tail"] for r in rows} == {split == "train"}


def test_lengths_are_lognormal_around_the_median_and_capped():
    task = LongTail(median=64, sigma=1.0, cap_factor=8.0)
    rng = random.Random(1)
    lengths = [task.length(rng) for _ in range(20000)]
    assert 60 <= statistics.median(lengths) <= 68
    assert min(lengths) >= 1 and max(lengths) == task.cap == 512
    at_cap = sum(length == 512 for length in lengths) / len(lengths)
    assert 0.012 < at_cap < 0.027  # P(lognormal > 8 × median) = P(z > ln 8) = 1.9 %
    assert statistics.fmean(lengths) > 1.4 * statistics.median(lengths)  # the tail: mean well above the median


def test_an_episode_asks_for_its_working_out_and_scores_the_answer_before_it():
    task = LongTail(median=16, seed=3)
    row = next(r for r in task.rows("train") if r["answer"] == 7)
    client = RecordingClient("7" + FILLER * 30)
    assert asyncio.run(task.rollout_fn()(client, row)) == 1.0
    (request,) = client.requests
    expected = task.length(random.Random(3))
    assert request["max_tokens"] == 4 + expected and request["ignore_eos"] is True

    sloppy = RecordingClient("7." + FILLER * 30)
    assert asyncio.run(task.rollout_fn()(sloppy, row)) == 0.0
    held_out = {**row, "tail": False}
    client = RecordingClient("7" + FILLER * 3)
    assert asyncio.run(task.rollout_fn()(client, held_out)) == 1.0
    assert client.requests[0]["max_tokens"] == 4 and client.requests[0]["ignore_eos"] is False
    assert answer_text("= 7" + FILLER) == "= 7" and answer_text(None) == ""


def test_the_starting_policy_learns_answers_followed_by_the_working_out_token():
    tokenizer = load_tokenizer(build_tiny_model(WarmupSpec().model))
    filler = tokenizer.encode(FILLER, add_special_tokens=False)
    assert len(filler) == 1, "the working-out token must be one token of the tiny tokenizer"
    spec = LongTailWarmupSpec(filler_tokens=5)
    label = _sloppy_label(tokenizer, 7, spec, random.Random(0))
    assert label[-5:] == filler * 5 and tokenizer.eos_token_id not in label
    plain = _sloppy_label(tokenizer, 7, WarmupSpec(), random.Random(0))
    assert plain[-1] == tokenizer.eos_token_id and filler[0] not in plain
    assert spec.key() != WarmupSpec().key()
