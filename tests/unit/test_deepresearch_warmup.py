"""examples/deepresearch warm-up pieces (no full training): synthetic trajectories with their mistakes,
labels exactly on the assistant's tokens, one token per entity name, and the shared-prefix loss."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from examples.deepresearch.retrieval import Bm25Index
from examples.deepresearch.reward import extract_boxed
from examples.deepresearch.tools import SCHEMAS
from examples.deepresearch.warmup import (
    WarmupSpec,
    _Batcher,
    copy_accuracy,
    entity_names,
    extend_vocabulary,
    share_updates,
    shared_prefix_loss,
    synthetic_conversation,
    tokenize_conversation,
)
from examples.deepresearch.world import WorldSpec, documents, generate_world, questions
from fullasync.models import load_tokenizer

SPEC = WarmupSpec(world=WorldSpec(people=100, organisations=40, cities=20, countries=4, events=20), batch_size=4)


@pytest.fixture(scope="module")
def world():
    world = generate_world(SPEC.world)
    return world, [r for r in questions(world) if r["split"] == "train"], Bm25Index(documents(world))


def test_trajectories_follow_the_gold_chain_with_the_configured_mistakes(world):
    _, rows, index = world
    row = next(r for r in rows if r["hops"] == 3)
    careful = synthetic_conversation(row, index, WarmupSpec(unboxed_share=0, stop_early_share=0,
                                                            repeat_search_share=0), random.Random(0))
    queries = [m["tool_calls"][0]["function"]["arguments"] for m in careful if m.get("tool_calls")]
    assert queries == [f'{{"query": "{q}"}}' for q in row["search_queries"]]
    assert extract_boxed(careful[-1]["content"]) == row["answer"]
    sloppy = [synthetic_conversation(row, index, WarmupSpec(unboxed_share=1, stop_early_share=1,
                                                            repeat_search_share=1), random.Random(s)) for s in range(5)]
    assert all(extract_boxed(c[-1]["content"]) is None and row["answer"] not in c[-1]["content"] for c in sloppy)
    assert all(len([m for m in c if m.get("tool_calls")]) % 2 == 0 for c in sloppy)  # every search twice


def test_labels_cover_exactly_the_assistant_turns_and_names_are_single_tokens(world, tiny_model_path):
    the_world, rows, index = world
    tokenizer = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    names = entity_names(the_world)
    ids = extend_vocabulary(tokenizer, model, names, seed=0)
    assert len(ids) == len(names) and model.get_input_embeddings().weight.shape[0] >= len(tokenizer)
    messages = synthetic_conversation(rows[0], index, SPEC, random.Random(1))
    token_ids, labels = tokenize_conversation(tokenizer, messages, [SCHEMAS["search"]])
    assert tokenizer.encode(rows[0]["search_queries"][0], add_special_tokens=False) == [
        tokenizer.convert_tokens_to_ids(rows[0]["search_queries"][0])]
    trained = tokenizer.decode([t for t in labels if t != -100])
    replies = [m for m in messages if m["role"] == "assistant"]
    assert trained.count("<|im_end|>") == len(replies) and trained.count("<tool_call>") == len(replies) - 1
    assert trained.endswith(messages[-1]["content"] + "<|im_end|>")
    assert rows[0]["question"] not in trained and "<tool_response>" not in trained


def test_shared_prefix_loss_equals_the_plain_loss_and_name_rows_move_together(world, tiny_model_path):
    the_world, rows, index = world
    tokenizer = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    names = extend_vocabulary(tokenizer, model, entity_names(the_world), seed=0)
    model.get_input_embeddings().weight.register_hook(share_updates(names))
    prefix, rest, attention, labels = _Batcher(SPEC, tokenizer, rows, index, random.Random(0)).batch()
    batch = rest.shape[0]
    full = model(input_ids=torch.cat([prefix[None].expand(batch, -1), rest], 1),
                 attention_mask=torch.cat([torch.ones(batch, len(prefix), dtype=attention.dtype), attention], 1),
                 labels=torch.cat([torch.full((batch, len(prefix)), -100), labels], 1)).loss
    shared = shared_prefix_loss(model, prefix, rest, attention, labels)
    assert shared.item() == pytest.approx(full.item(), rel=1e-5)
    shared.backward()
    grad = model.get_input_embeddings().weight.grad
    assert torch.equal(grad[names], grad[names[:1]].expand(len(names), -1)) and grad[names[0]].abs().sum() > 0


def test_copy_phase_trains_only_the_first_search_call_and_the_probe_reads_the_first_query(world, tiny_model_path):
    the_world, rows, index = world
    tokenizer = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    extend_vocabulary(tokenizer, model, entity_names(the_world), seed=0)
    prefix, rest, attention, labels = _Batcher(SPEC, tokenizer, rows, index, random.Random(0)).batch("copy")
    assert rest.shape[0] == SPEC.copy_batch_size
    for row in range(rest.shape[0]):
        text = tokenizer.decode(torch.cat([prefix, rest[row][attention[row] == 1]]))
        trained = tokenizer.decode([t for t in labels[row].tolist() if t != -100])
        assert text.count("<|im_start|>assistant") == 1 and "<tool_response>" not in text and "<tools>" not in text
        query = trained.split('"query": "')[1].split('"')[0]
        assert trained.startswith("<tool_call>") and trained.endswith("<|im_end|>") and query in text.split("user")[1]

    # the probe scores 1 for a model that puts the name first, 0 for one that never does
    probe = [r for r in rows if r["hops"] == 1][:3]

    class Oracle(torch.nn.Module):
        def __init__(self, boost_name: bool):
            super().__init__()
            self.boost_name = boost_name

        def forward(self, input_ids):
            logits = torch.zeros(1, input_ids.shape[1], len(tokenizer))
            if self.boost_name:  # the one name in the question, copied
                name = next(t for t in input_ids[0].tolist() if tokenizer.convert_ids_to_tokens(t) in set(
                    entity_names(the_world)))
                logits[0, -1, name] = 1.0
            return type("Output", (), {"logits": logits})()

    assert copy_accuracy(Oracle(True), tokenizer, probe, SPEC) == 1.0
    assert copy_accuracy(Oracle(False), tokenizer, probe, SPEC) == 0.0
