"""A streamed call's text is decoded incrementally (only the new ids and a few before them) and must equal the
whole decode after every delta — on the tiny tokenizer, SmolLM2's, and a SentencePiece-style one (a word's
space carried by its token, stripped at the start of a decode) with spaces cleaned up around punctuation.

Ids come from real text (multi-byte characters, punctuation) cut at random token boundaries, mixed with
random ids (lone bytes of a multi-byte character, special tokens), in deltas of random sizes."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from fullasync.client.streaming import IncrementalText, TextDeltas
from fullasync.models import build_pretrained_model, load_tokenizer

TEXTS = ("The answer is 42. It isn't 41, is it ? No .", "café naïve 日本語 数学 Привет 🙂 👩‍💻 → ≤ ﬁ e\u0301",
         "def f(x):\n    return x * 2  # doubled\n\n", "<tool_call>{\"name\": \"add\"}</tool_call>",
         "  spaced  \t end.")


def sentencepiece_style() -> PreTrainedTokenizerFast:
    """A small BPE trained here with Llama's conventions: '▁' for a space, the first word's stripped on decode."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{value:02X}>" for value in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens])
    tokenizer.train_from_iterator(list(TEXTS) * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module", params=["tiny", "smollm2", "sentencepiece-style"])
def tokenizer_under_test(request, tokenizer):
    if request.param == "tiny":
        return tokenizer
    if request.param == "smollm2":
        return load_tokenizer(build_pretrained_model("smollm2-135m-instruct"))
    return sentencepiece_style()


def random_ids(rng: random.Random, tokenizer) -> list[int]:
    ids: list[int] = []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.7:
            ids += tokenizer.encode(rng.choice(TEXTS), add_special_tokens=False)
        else:
            ids += [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 5))]
    return ids


@pytest.mark.parametrize("settle_every", [1, IncrementalText.SETTLE_EVERY])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_incremental_text_is_the_whole_decode_after_every_delta(tokenizer_under_test, skip_special_tokens,
                                                                    settle_every, monkeypatch):
    monkeypatch.setattr(IncrementalText, "SETTLE_EVERY", settle_every)
    def decode(ids: list[int]) -> str:
        return tokenizer_under_test.decode(ids, skip_special_tokens=skip_special_tokens)

    rng = random.Random(7)
    checked = 0
    for _ in range(150):
        ids, text, at = random_ids(rng, tokenizer_under_test), IncrementalText(decode), 0
        while at < len(ids):
            size = rng.choice((1, 1, 2, 3, 8, 16))
            assert text.push(ids[at : at + size]) == decode(ids[: at + size]), ids[: at + size]
            at, checked = at + size, checked + 1
    assert checked > 300


def test_a_long_stream_decodes_each_id_a_bounded_number_of_times(tokenizer):
    """The cost of a push follows the ids it adds, not the length of the whole (which made long streams quadratic)."""
    decoded: list[int] = []

    def decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return tokenizer.decode(ids, skip_special_tokens=True)

    ids = tokenizer.encode(" ".join(TEXTS) * 40, add_special_tokens=False)
    deltas = TextDeltas(decode, ("</tool_call>",))
    for at in range(0, len(ids), 8):
        deltas.push(ids[at : at + 8])
    assert len(ids) > 2000
    assert sum(decoded) < 4 * len(ids)  # the whole decode after every delta: ~len(ids)² / 16


def test_a_decode_that_changes_the_text_before_the_new_ids_is_still_followed_exactly(monkeypatch):
    """Cleaning up " ." to "." rewrites text already settled; the window then fails to extend its context's text
    and the whole is decoded."""
    pieces = ["a", " ", ".", "b", "'s", " n't", "\n", "x"]

    def decode(ids: list[int]) -> str:
        text = "".join(pieces[i] for i in ids)
        for spaced, cleaned in ((" .", "."), (" 's", "'s"), (" n't", "n't")):
            text = text.replace(spaced, cleaned)
        return text

    monkeypatch.setattr(IncrementalText, "SETTLE_EVERY", 1)
    rng = random.Random(3)
    for _ in range(300):
        ids, text, at = [rng.randrange(len(pieces)) for _ in range(rng.randint(1, 40))], IncrementalText(decode), 0
        while at < len(ids):
            size = rng.choice((1, 2, 5))
            assert text.push(ids[at : at + size]) == decode(ids[: at + size])
            at += size
