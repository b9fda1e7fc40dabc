"""Shared prefixes computed once: a micro-batch's sequences packed as a prefix tree, every continuation attending to
the keys and values of the prefix it shares with others.

Owns: `build_tree` (the tree of one packed row: each prefix of at least `MIN_SHARED_TOKENS` tokens that several of
its sequences start with is held once), the attention of a tree (`tree_attention`: each segment of the tree attends to
its ancestors' tokens, all visible, and causally to its own), `SharedPrefixDecoder`, which runs a model's decoder
stack on the tree of its packed row and hands on the hidden states of the row as it came (each token's copy of its
tree node's state), and the output layer's stand-ins, which compute once per tree state what the model computes
from those states: the logits (`_SharedLogits`), or under verl's fused-kernel forward each position's log-prob of its
next token and entropy, once per (tree state, next token) (`_SharedFusedForward`: a shared prefix's last state is
followed by each continuation's first token), handed to every copy. The loss runs on the row as it came, so every
sequence's log-probs, entropies and loss terms are the unshared path's, and the gradient of a shared token is the
sum of its copies' (the index gathers' backward): a trained token that several sequences hold weighs as many times
as the unshared path trains it. Does not own: forming the micro-batches (`batch.py`, with `plan_micro_batches`) or
the loss.

Why keys and values and not an ancestor mask over the whole tree: `attention.py` runs causal SDPA per packed sequence
to never build a [tokens, tokens] mask. Here a segment attends to its context's keys through one flash pass (no mask)
and to its own causally through another, merged by their log-sum-exps (`_ContextThenCausal`, torch's CPU flash
kernel): no score matrix is held, so memory stays below the unshared path's. Off CPU (or where that kernel is
missing) the segment attends through SDPA with its [own tokens, context + own tokens] mask: the rows of the unshared
path's mask that the segment would have.

Under Ulysses sequence parallelism each rank holds a slice of the row: the ranks gather the row's token ids (no
gradient), build the same tree, each runs its slice of the tree's row, and the tree's hidden states are gathered
(their gradient summed over the ranks) before each rank takes its slice of the row back.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

import numpy as np
import torch
from torch.nn.functional import scaled_dot_product_attention

MIN_SHARED_TOKENS = 32  # a common prefix shorter than this is computed in each sequence (a segment costs a pass)


@dataclass(frozen=True)
class Segment:
    """Tokens [start, end) of the tree's row: one node of the tree. `context` holds the row positions of its
    ancestors' tokens, root first (None for a root): the segment's tokens see all of them and causally each other."""

    start: int
    end: int
    context: torch.Tensor | None
    _keys: list[torch.Tensor] = field(default_factory=list, compare=False, repr=False)  # (keys, mask), built once

    def keys_and_mask(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row positions the segment attends to: context then itself, [own tokens, those] bool mask)."""
        if not self._keys:
            assert self.context is not None, "a root attends causally to itself"
            own = self.end - self.start
            positions = torch.cat([self.context, torch.arange(self.start, self.end)])
            mask = torch.ones((own, len(positions)), dtype=torch.bool)
            mask[:, len(self.context):] = torch.ones((own, own), dtype=torch.bool).tril()
            self._keys.extend((positions, mask))
        return self._keys[0], self._keys[1]


@dataclass(frozen=True)
class PrefixTree:
    """One packed row as a tree: `token_ids` and `positions` (each token's position in its sequences) of the tree's
    row, its `segments` in row order covering it, and `expand` (the row as it came, (T,)): the tree-row position of
    each of its tokens. Tokens of the tree's row past the last segment (padding) attend causally among themselves."""

    token_ids: torch.Tensor  # (distinct,) long
    positions: torch.Tensor  # (distinct,) long
    segments: tuple[Segment, ...]
    expand: torch.Tensor  # (total,) long

    @property
    def distinct(self) -> int:
        return len(self.token_ids)

    @property
    def total(self) -> int:
        return len(self.expand)


def build_tree(token_ids: np.ndarray, positions: np.ndarray, min_shared: int = MIN_SHARED_TOKENS) -> PrefixTree | None:
    """The prefix tree of one packed row (sequences start where the position is 0 and count up by one), or None
    where no prefix of at least `min_shared` tokens is shared (the row is computed as it is)."""
    starts = [0, *np.flatnonzero(positions[1:] == 0) + 1, len(positions)]
    sequences = [token_ids[a:b] for a, b in zip(starts, starts[1:], strict=False)]
    if any(not np.array_equal(positions[a:b], np.arange(b - a)) for a, b in zip(starts, starts[1:], strict=False)):
        return None  # positions that do not restart at 0 and count up (a row this module does not read)
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].tolist())
    common = [_common_length(sequences[order[k]], sequences[order[k + 1]]) for k in range(len(order) - 1)]
    builder = _TreeBuilder(sequences, min_shared)
    builder.grow(order, common)
    if not builder.shared:
        return None
    expand = torch.cat([builder.path[i] for i in range(len(sequences))])
    return PrefixTree(torch.from_numpy(np.concatenate(builder.token_ids)),
                      torch.from_numpy(np.concatenate(builder.positions)), tuple(builder.segments), expand)


class _TreeBuilder:
    """Segments of the tree over sequences sorted by their tokens, `common[k]` the length of the prefix sorted
    sequences k and k+1 share: a range of them sharing ≥ min_shared tokens past its parent gets a node of those
    tokens, and its runs that share more become its children."""

    def __init__(self, sequences: list[np.ndarray], min_shared: int) -> None:
        self.sequences, self.min_shared = sequences, min_shared
        self.segments: list[Segment] = []
        self.token_ids: list[np.ndarray] = []
        self.positions: list[np.ndarray] = []
        self.path: dict[int, torch.Tensor] = {}  # sequence → the tree-row positions of its tokens
        self.shared = False
        self.length = 0

    def grow(self, order: list[int], common: list[int]) -> None:
        # (sorted range [lo, hi), the depth its tokens start at, the tree-row positions of the tokens above it)
        stack: list[tuple[int, int, int, torch.Tensor | None]] = [(0, len(order), 0, None)]
        while stack:
            lo, hi, depth, context = stack.pop()
            if hi - lo == 1:
                sequence = order[lo]
                own = self._segment(sequence, depth, len(self.sequences[sequence]), context)
                self.path[sequence] = own
                continue
            shared = min(common[lo:hi - 1])
            if shared - depth >= self.min_shared:
                context = self._segment(order[lo], depth, shared, context)
                self.shared, depth = True, shared
            cuts = [k + 1 for k in range(lo, hi - 1) if common[k] == shared]
            runs = list(zip([lo, *cuts], [*cuts, hi], strict=True))
            stack.extend((a, b, depth, context) for a, b in reversed(runs))

    def _segment(self, sequence: int, depth: int, end: int, context: torch.Tensor | None) -> torch.Tensor:
        """Append the sequence's tokens [depth, end) as a segment; the tree-row positions of its path so far."""
        here = torch.arange(self.length, self.length + end - depth)
        if end > depth:
            self.segments.append(Segment(self.length, self.length + end - depth, context))
            self.token_ids.append(self.sequences[sequence][depth:end])
            self.positions.append(np.arange(depth, end))
            self.length += end - depth
        return here if context is None else torch.cat([context, here])


def _common_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the prefix two token arrays share."""
    length = min(len(a), len(b))
    differ = np.flatnonzero(a[:length] != b[:length])
    return int(differ[0]) if len(differ) else length


def tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tree: PrefixTree, *,
                   dropout: float, scale: float | None) -> torch.Tensor:
    """Attention of the tree's row: query (1, heads, L, dim), key and value (1, kv_heads, L, dim) with L ≥ the
    tree's distinct tokens (padding after them attends causally to itself); returns (1, heads, L, dim)."""
    gqa = query.shape[1] != key.shape[1]
    merged = dropout == 0.0 and query.device.type == "cpu" and _FLASH_CPU is not None
    outputs = []
    for segment in tree.segments:
        own = slice(segment.start, segment.end)
        if segment.context is None:
            outputs.append(scaled_dot_product_attention(query[:, :, own], key[:, :, own], value[:, :, own],
                                                        dropout_p=dropout, is_causal=True, scale=scale,
                                                        enable_gqa=gqa))
        elif merged:
            context = segment.context.to(key.device)
            heads = query.shape[1] // key.shape[1]
            keys = [t.repeat_interleave(heads, dim=1) if gqa else t
                    for t in (key.index_select(2, context), value.index_select(2, context), key[:, :, own],
                              value[:, :, own])]
            outputs.append(_ContextThenCausal.apply(query[:, :, own], *keys, scale))
        else:
            positions, mask = segment.keys_and_mask()
            positions, mask = positions.to(key.device), mask.to(key.device)
            outputs.append(scaled_dot_product_attention(query[:, :, own], key.index_select(2, positions),
                                                        value.index_select(2, positions), attn_mask=mask,
                                                        dropout_p=dropout, scale=scale, enable_gqa=gqa))
    if query.shape[2] > tree.distinct:
        tail = slice(tree.distinct, query.shape[2])
        outputs.append(scaled_dot_product_attention(query[:, :, tail], key[:, :, tail], value[:, :, tail],
                                                    dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa))
    return torch.cat(outputs, dim=2)


# torch's CPU flash-attention kernel, which returns each query's log-sum-exp (the public SDPA does not); None where
# this torch lacks it (then a segment attends through SDPA with its mask)
_FLASH_CPU: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_CPU_BACKWARD: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


class _ContextThenCausal(torch.autograd.Function):
    """A segment's queries attending to its context's keys (all visible) and causally to its own, without a mask:
    one flash pass over each part, merged by their log-sum-exps into the softmax over both. The backward runs each
    pass's flash backward with the merged output and log-sum-exp: every probability it recomputes is then the merged
    softmax's, so each part's gradients are exact. With a mask SDPA on CPU falls back to a kernel that holds the
    [queries, keys] scores per head (a 1k-token continuation of a 16k prompt: 64 MB a head, per segment and layer)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, query: torch.Tensor, context_key: torch.Tensor,
                context_value: torch.Tensor, own_key: torch.Tensor, own_value: torch.Tensor,
                scale: float | None) -> torch.Tensor:
        assert _FLASH_CPU is not None, "tree_attention merges only where torch has the CPU flash kernel"
        to_context, context_lse = _FLASH_CPU(query, context_key, context_value, 0.0, False, scale=scale)
        to_own, own_lse = _FLASH_CPU(query, own_key, own_value, 0.0, True, scale=scale)
        lse = torch.logaddexp(context_lse, own_lse)
        output = (to_context * (context_lse - lse).exp().unsqueeze(-1)
                  + to_own * (own_lse - lse).exp().unsqueeze(-1)).to(query.dtype)
        ctx.save_for_backward(query, context_key, context_value, own_key, own_value, output, lse)
        ctx.scale = scale  # type: ignore[attr-defined]  # autograd's context holds what the backward needs
        return output

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, context_key, context_value, own_key, own_value, output, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        grad = grad.contiguous()
        assert _FLASH_CPU_BACKWARD is not None, "the forward ran the CPU flash kernel: its backward is there too"
        scale = ctx.scale  # type: ignore[attr-defined]
        dq_context, dk_context, dv_context = _FLASH_CPU_BACKWARD(grad, query, context_key, context_value, output, lse,
                                                                 0.0, False, scale=scale)
        dq_own, dk_own, dv_own = _FLASH_CPU_BACKWARD(grad, query, own_key, own_value, output, lse, 0.0, True,
                                                     scale=scale)
        return dq_context + dq_own, dk_context, dv_context, dk_own, dv_own, None


class SharedPrefixDecoder:
    """Stands in for a decoder stack's `forward` (the model's `get_decoder()`): a packed row (one row of sequences,
    positions restarting at 0) runs as its prefix tree, and its hidden states come back in the row's layout. Other
    inputs run as they are. Counts `tokens` (the rows' tokens) and `distinct` (what the decoder computed) until
    `take_counts()`."""

    def __init__(self, forward: Callable[..., BaseModelOutputWithPast], min_shared: int = MIN_SHARED_TOKENS) -> None:
        self.forward, self.min_shared = forward, min_shared
        self.tokens = self.distinct = 0
        self.head_positions = 0  # what the output layer's stand-ins computed (tests read it)
        self.head = "decoder only"  # which output layer runs once per tree state: "logits" or "fused"
        # the last row handed on: (its states, the tree's states, each row position's place among them)
        self._handed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def take_counts(self) -> tuple[int, int]:
        """(tokens, distinct) since the last call."""
        counts = (self.tokens, self.distinct)
        self.tokens = self.distinct = 0
        return counts

    def tree_states(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the tree's states, each of `hidden`'s positions' place among them) where `hidden` is the row of states
        the last call handed on (the same tensor or a view of all of it); None otherwise. Taken once."""
        handed, self._handed = self._handed, None
        if handed is None or hidden.data_ptr() != handed[0].data_ptr() or hidden.shape != handed[0].shape:
            return None
        return handed[1], handed[2]

    def __call__(self, input_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                 **kwargs: object) -> BaseModelOutputWithPast:
        if (input_ids is None or position_ids is None or input_ids.dim() != 2 or input_ids.shape[0] != 1
                or position_ids.shape != input_ids.shape or kwargs.get("inputs_embeds") is not None):
            return self.forward(input_ids=input_ids, position_ids=position_ids, **kwargs)
        self._handed = None
        group, ranks, rank = sequence_parallel()
        row_ids, row_positions = (_gathered(t[0], group, ranks) for t in (input_ids, position_ids))
        tree = build_tree(row_ids.cpu().numpy(), row_positions.cpu().numpy(), self.min_shared)
        if rank == 0:  # a sequence-parallel group's ranks hold the same row
            self.tokens += len(row_ids)
            self.distinct += len(row_ids) if tree is None else tree.distinct
        if tree is None:
            return self.forward(input_ids=input_ids, position_ids=position_ids, **kwargs)
        ids, positions = tree.token_ids, tree.positions
        if ranks > 1:  # the tree's row in equal slices: padding of its own positions, as verl pads a row
            pad = -len(ids) % ranks
            ids = torch.cat([ids, torch.zeros(pad, dtype=ids.dtype)])
            positions = torch.cat([positions, torch.arange(pad)])
            share = len(ids) // ranks
            ids, positions = ids[rank * share:(rank + 1) * share], positions[rank * share:(rank + 1) * share]
        output = self.forward(input_ids=ids.to(input_ids.device)[None],
                              position_ids=positions.to(position_ids.device)[None], prefix_tree=tree, **kwargs)
        hidden: torch.Tensor | None = output.last_hidden_state
        if hidden is None:
            raise ValueError("the decoder returned no last_hidden_state: prefix sharing needs a decoder stack's output")
        expand = tree.expand.to(hidden.device)
        if ranks > 1:
            from torch.distributed.nn.functional import all_gather  # differentiable: a slice's gradient is the sum
            # of every rank's (a rank's loss reads tree states of any slice)
            hidden = torch.cat(all_gather(hidden, group=group), dim=1)
            local = input_ids.shape[1]
            expand = expand[rank * local:(rank + 1) * local]
        expanded = hidden.index_select(1, expand)
        self._handed = (expanded, hidden, expand)
        output["last_hidden_state"] = expanded  # ModelOutput: the attribute too
        return output


class _SharedLogits:
    """Stands in for a model's output layer (`lm_head.forward`): on the states the decoder's stand-in handed on, the
    layer runs once per tree state this rank's row reads and the logits are handed out to every copy."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], decoder: SharedPrefixDecoder) -> None:
        self.forward, self.decoder = forward, decoder

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        states = self.decoder.tree_states(hidden)
        if states is None:
            return self.forward(hidden)
        tree_hidden, expand = states
        needed, copies = torch.unique(expand, return_inverse=True)
        self.decoder.head_positions += len(needed)
        return self.forward(tree_hidden.index_select(1, needed)).index_select(1, copies)


# what verl's fused forward hands its decoder call (the rest of its arguments are the loss's)
_BASE_MODEL_ARGUMENTS = ("attention_mask", "past_key_values", "inputs_embeds", "use_cache", "output_attentions",
                         "output_hidden_states", "cache_position")


class _SharedFusedForward:
    """Stands in for verl's fused-kernel forward of a dense model (`dense_common.forward_with_torch_backend`: the
    decoder, then each position's log-prob of its next token and entropy from the last states, 512 positions at a
    time): on the states the decoder's stand-in handed on, they are computed once per distinct (tree state, next
    token) — a shared prefix's positions once, its last position once per continuation — and handed to every copy."""

    def __init__(self, model: torch.nn.Module, decoder: SharedPrefixDecoder) -> None:
        self.model, self.decoder = model, decoder

    def __call__(self, input_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                 shift_labels: torch.Tensor | None = None, temperature: float = 1.0, labels: torch.Tensor | None = None,
                 **kwargs: object) -> object:
        from verl.models.transformers.dense_common import CausalLMOutputForPPO, forward_base_model
        from verl.utils.experimental.torch_functional import FusedLinearForPPO

        passed = {name: value for name, value in kwargs.items() if name in _BASE_MODEL_ARGUMENTS}
        decoder_call: Callable[..., CausalLMOutputWithPast] = forward_base_model  # verl's: the model's decoder
        outputs = decoder_call(self.model, input_ids=input_ids, position_ids=position_ids, **passed)
        hidden = outputs[0]
        if shift_labels is None:
            source = labels if labels is not None else input_ids
            assert source is not None, "the fused forward reads its labels from input_ids, labels or shift_labels"
            shift_labels = torch.roll(source, shifts=-1, dims=-1)
        fused = FusedLinearForPPO(impl_backend=getattr(self.model, "_verl_fused_kernels_backend", "torch"))
        weights = self.model.get_output_embeddings().weight  # type: ignore[operator]  # transformers' method
        states = self.decoder.tree_states(hidden)
        if states is None:
            log_probs, entropy = fused(hidden_states=hidden, vocab_weights=weights, input_ids=shift_labels,
                                       temperature=temperature)
        else:
            tree_hidden, expand = states
            vocabulary = weights.shape[0]
            pairs, copies = torch.unique(expand * vocabulary + shift_labels.reshape(-1), return_inverse=True)
            log_probs, entropy = fused(hidden_states=tree_hidden.index_select(1, pairs // vocabulary),
                                       vocab_weights=weights, input_ids=(pairs % vocabulary)[None],
                                       temperature=temperature)
            log_probs, entropy = log_probs.index_select(1, copies), entropy.index_select(1, copies)
            self.decoder.head_positions += len(pairs)
        return CausalLMOutputForPPO(log_probs=log_probs, entropy=entropy, past_key_values=outputs.past_key_values,
                                    hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def install(model: torch.nn.Module, min_shared: int = MIN_SHARED_TOKENS) -> SharedPrefixDecoder:
    """Run `model`'s decoder stack (`get_decoder()`, through LoRA's wrapper) on the prefix trees of its packed rows,
    and its output layer once per tree state: the logits layer, or under verl's fused-kernel forward of a dense
    model the log-probs and entropy once per (tree state, next token). The model must attend with
    `attention.PACKED_SDPA`. Returns the decoder's stand-in (its token counts)."""
    decoder = model.get_decoder()  # type: ignore[operator]  # transformers' method (Module's getattr to mypy)
    current = decoder.forward
    if isinstance(current, SharedPrefixDecoder):
        return current
    shared = SharedPrefixDecoder(current, min_shared)
    decoder.forward = shared  # this module only, not its class
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]  # LoRA's
    head = base.get_output_embeddings()  # type: ignore[operator]  # transformers' method
    head.forward = _SharedLogits(head.forward, shared)
    shared.head = "logits"
    fused = getattr(type(base), "forward", None)
    if (getattr(fused, "__name__", "") == "forward_with_torch_backend"
            and getattr(fused, "__module__", "") == "verl.models.transformers.dense_common"):
        base.forward = _SharedFusedForward(base, shared)  # verl's fused forward, of this model only
        shared.head = "fused"
    return shared


def sequence_parallel() -> tuple[ProcessGroup | None, int, int]:
    """(verl's Ulysses group or None, its size, this rank's place in it); none where verl is not loaded (only
    verl's engines set a group)."""
    ulysses = sys.modules.get("verl.utils.ulysses")
    group = ulysses.get_ulysses_sequence_parallel_group() if ulysses is not None else None
    if ulysses is None or group is None:
        return None, 1, 0
    ranks = ulysses.get_ulysses_sequence_parallel_world_size(group)
    return group, ranks, torch.distributed.get_rank(group) if ranks > 1 else 0


def _gathered(local: torch.Tensor, group: ProcessGroup | None, ranks: int) -> torch.Tensor:
    """The whole row from the ranks' slices (integers, no gradient)."""
    if ranks == 1:
        return local
    slices = [torch.empty_like(local) for _ in range(ranks)]
    torch.distributed.all_gather(slices, local.contiguous(), group=group)
    return torch.cat(slices)


def plan_micro_batches(sequences: list[np.ndarray], budget: int,
                       min_shared: int = MIN_SHARED_TOKENS) -> list[list[int]]:
    """Micro-batches (lists of indices into `sequences`) that keep sequences with common prefixes together: the
    sequences in the order of their tokens (each next to the one it shares the longest prefix with), cut where a
    micro-batch would compute more than `budget` distinct tokens (a shared prefix of ≥ min_shared tokens counted
    once; a sequence longer than the budget alone)."""
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].tolist())
    plans: list[list[int]] = []
    cost = 0
    for place, index in enumerate(order):
        shared = _common_length(sequences[order[place - 1]], sequences[index]) if place else 0
        added = len(sequences[index]) - (shared if shared >= min_shared else 0)
        if plans and plans[-1] and cost + added <= budget:
            plans[-1].append(index)
            cost += added
        else:
            plans.append([index])
            cost = len(sequences[index])
    return plans
