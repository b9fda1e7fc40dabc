"""The output layer of shared prefixes under verl's fused-kernel forward (`trainer.chunked_logprobs`: each position's
log-prob of its next token and entropy from the last states, in chunks), in-process with the tiny model and verl's
own forward (`dense_common.forward_with_torch_backend`) as the reference: with `prefix_sharing.install`, computed
once per distinct (tree state, next token), the log-probs, entropies and gradients are the reference's on a group
with a shared prompt and an episode's forked lineages; the comparison fails when a copy reads the wrong pair."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from fullasync.trainer import attention, prefix_sharing


def rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, T) token ids and positions of a packed row: 4 continuations of a 120-token prompt, two lineages that share
    60 tokens after another prompt, and the first continuation again (its copy: the same pairs all through)."""
    rng = random.Random(seed)

    def text(count: int) -> list[int]:
        return [rng.randrange(5, 1000) for _ in range(count)]

    prompt, other = text(120), text(80)
    group = [prompt + text(30 + 9 * i) for i in range(4)]
    early = other + text(60)
    sequences = [*group, early + text(25), early + text(33), list(group[0])]
    ids = torch.tensor([t for s in sequences for t in s])[None]
    positions = torch.tensor([p for s in sequences for p in range(len(s))])[None]
    return ids, positions


@pytest.fixture
def fused_model(tiny_model_path):
    """A fresh tiny model whose forward is verl's fused-kernel one (its own class, as verl's patch gives it)."""
    from verl.models.transformers.dense_common import forward_with_torch_backend

    attention.register()

    def build() -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation=attention.PACKED_SDPA,
                                                     dtype=torch.float32)
        model.__class__ = type("FusedForward", (type(model),), {"forward": forward_with_torch_backend})
        model._verl_fused_kernels_backend = "torch"
        return model
    return build


def run(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor):
    """(log-probs and entropies, each parameter's gradient) of a weighted sum of both."""
    output = model(input_ids=ids, position_ids=positions, return_dict=True, temperature=0.7,
                   shift_labels=torch.roll(ids, shifts=-1, dims=-1))
    weights = torch.rand(ids.shape[1], generator=torch.Generator().manual_seed(2))
    (output.log_probs[0] * weights + 0.1 * output.entropy[0]).sum().backward()
    values = torch.cat([output.log_probs.detach(), output.entropy.detach()])
    return values, {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same(plain, shared) -> None:
    (values_a, grads_a), (values_b, grads_b) = plain, shared
    assert (values_a - values_b).abs().max() < 1e-5
    for name, grad in grads_a.items():
        assert (grad - grads_b[name]).abs().max() <= 1e-5 * max(grad.abs().max(), 1e-3), name


def test_fused_log_probs_and_entropy_once_per_tree_state_and_next_token_are_verls_own(fused_model):
    ids, positions = rows()
    plain = run(fused_model(), ids, positions)
    model = fused_model()
    shared = prefix_sharing.install(model)
    result = run(model, ids, positions)
    tokens, distinct = shared.take_counts()
    # one pair per tree state but where a state is followed by several next tokens: the prompt's last once per
    # continuation (4), the lineages' shared last once per lineage (2); the copy adds none
    assert shared.head_positions == distinct + (4 - 1) + (2 - 1)
    assert tokens > 2 * distinct
    assert_same(plain, result)


def test_the_comparison_fails_when_a_copy_reads_the_pair_of_the_next_state(fused_model, monkeypatch):
    ids, positions = rows()
    plain = run(fused_model(), ids, positions)
    honest = prefix_sharing.SharedPrefixDecoder.tree_states

    def shifted(self, hidden):
        states = honest(self, hidden)
        return None if states is None else (states[0], (states[1] + 1).clamp(max=states[0].shape[1] - 1))
    monkeypatch.setattr(prefix_sharing.SharedPrefixDecoder, "tree_states", shifted)
    model = fused_model()
    prefix_sharing.install(model)
    with pytest.raises(AssertionError):
        assert_same(plain, run(model, ids, positions))
