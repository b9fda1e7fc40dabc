"""The harness examples' warm-up pieces (no full training): the mini-swe demonstrations and their mistakes, task
names as single tokens, the copy phase's first turns, the loss that weighs names as much as the rest, and the copy
probe."""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM

from examples.harness_warmup import _loss, copy_accuracy, encode_turns, first_turn
from examples.mini_swe.warmup import MISTAKES, demonstration, sloppy_demonstration
from fullasync.models import load_tokenizer
from fullasync.tasks.warmup import extend_vocabulary, prefix_logits, shared_prefix_batch
from fullasync_agents.swe_tasks.settings import ALL_NAMES, WARMUP_NAMES, oracle_command, setting_rows


def _policy(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    extend_vocabulary(tokenizer, model, list(ALL_NAMES), seed=0, scale=8.0)
    return tokenizer, model


def test_demonstrations_use_only_the_warm_up_pool_and_make_each_mistake():
    rng = random.Random(0)
    demos = [sloppy_demonstration(rng, correct_share=0.6) for _ in range(400)]
    task_names = {row["answer"] for row in setting_rows()}
    named = [name for demo in demos for name in WARMUP_NAMES if f'"{name}"' in demo[1]["content"]]
    assert len(named) == 400 and not task_names & set(named)
    first_actions = [demo[2]["content"] for demo in demos]
    right = sum(oracle_command(name) in action for name, action in zip(named, first_actions, strict=True))
    assert 200 <= right <= 280  # 0.6 of 400, loosely
    assert {mistake: sum(1 for a in first_actions if marker(a)) > 20 for mistake, marker in zip(MISTAKES, (
        lambda a: "tests/test_settings.py" in a, lambda a: "MODE = \"" not in a and "sed" in a,
        lambda a: "sed" not in a), strict=True)} == dict.fromkeys(MISTAKES, True)


def test_names_are_one_token_and_the_copy_phase_sees_the_first_turn_without_the_system_prompt(tiny_model_path):
    tokenizer, _ = _policy(tiny_model_path)
    row = setting_rows("held_out")[0]
    messages = demonstration(row["answer"], None)
    ids, labels = encode_turns(tokenizer, messages)
    name_id = tokenizer.convert_tokens_to_ids(row["answer"])
    assert ids.count(name_id) == 2 and [label for label in labels if label == name_id] == [name_id]  # hint + fix
    first = first_turn(messages)
    assert [m["role"] for m in first] == ["user", "assistant"] and first[1] == messages[2]


def test_the_loss_adds_the_names_mean_to_the_mean_over_all_labels_and_the_shared_prefix_changes_nothing(
        tiny_model_path):
    tokenizer, model = _policy(tiny_model_path)
    prefix, rest, attention, labels = shared_prefix_batch(
        [encode_turns(tokenizer, demonstration(name, None)) for name in WARMUP_NAMES[:3]])
    assert len(prefix) > 100  # the system prompt and the fixed words run once
    input_ids = torch.cat([prefix[None].expand(3, -1), rest], 1)
    full_attention = torch.cat([torch.ones(3, len(prefix), dtype=attention.dtype), attention], 1)
    full_labels = torch.cat([torch.full((3, len(prefix)), -100), labels], 1)
    plain = model(input_ids=input_ids, attention_mask=full_attention, labels=full_labels).loss
    assert torch.allclose(_loss(prefix_logits(model, prefix, rest, attention), labels,
                                torch.tensor([], dtype=torch.long)), plain, atol=1e-6)
    names = torch.tensor(tokenizer.convert_tokens_to_ids(list(WARMUP_NAMES[:3])))
    logits = model(input_ids=input_ids, attention_mask=full_attention).logits[:, :-1]
    targets = full_labels[:, 1:]
    at_names = torch.isin(targets, names)
    name_loss = torch.nn.functional.cross_entropy(logits[at_names], targets[at_names])
    assert name_loss > 5  # untrained: about log(vocabulary) on a name
    (plain + name_loss).backward()
    expected = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad()
    loss = _loss(prefix_logits(model, prefix, rest, attention), labels, names)
    assert torch.allclose(loss, plain + name_loss, atol=1e-5)
    loss.backward()  # the prefix ran once, and its gradients are those of the padded forward
    for parameter, grad in zip(model.parameters(), expected, strict=True):
        assert (parameter.grad - grad).abs().max() <= 1e-4 * grad.abs().max() + 1e-7


def test_the_copy_probe_counts_a_name_only_when_it_is_the_most_likely_token(tiny_model_path):
    tokenizer, _ = _policy(tiny_model_path)
    probes = [(demonstration(row["answer"], None), row["answer"]) for row in setting_rows("held_out")[:3]]

    class Copier(torch.nn.Module):  # puts all mass on `favourite` at every position
        def __init__(self, favourite):
            super().__init__()
            self.favourite = favourite

        def forward(self, input_ids):
            logits = torch.zeros(1, input_ids.shape[1], len(tokenizer))
            logits[..., self.favourite] = 1.0
            return type("Out", (), {"logits": logits})()

    first_name = tokenizer.convert_tokens_to_ids(probes[0][1])
    assert copy_accuracy(Copier(first_name), tokenizer, probes) == 1 / 3
