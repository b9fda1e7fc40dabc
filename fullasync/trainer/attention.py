"""Attention over packed micro-batches without flash-attention: causal SDPA sequence by sequence, and Ulysses
sequence parallelism around it.

Owns: `PACKED_SDPA`, a transformers attention function (registered under that name by `register()`) for
padding-free micro-batches — all sequences of a micro-batch in one row, each starting at position 0. Each sequence
attends causally to itself through `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`, so no
[tokens, tokens] mask is built (transformers' SDPA path builds one for a packed row: 4 GB at 32k tokens, and the
unfused kernel it forces holds a score matrix of that size per head). Under verl's Ulysses sequence parallelism (a
group of ranks each holding a slice of the row) it exchanges query, key and value so that each rank holds the whole
row for its share of the heads (verl's all-to-all), attends, and exchanges back: verl patches only flash-attention
for Ulysses, and on CPU there is none.

Runs inside trainer workers; the model must be built with `attn_implementation=PACKED_SDPA` after `register()`.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from fullasync.trainer.prefix_sharing import PrefixTree, sequence_parallel, tree_attention

PACKED_SDPA = "fullasync_packed_sdpa"  # the name models are built with (transformers' AttentionInterface)


def register() -> None:
    """Make `PACKED_SDPA` a transformers attention implementation in this process (idempotent). transformers then
    builds no mask for it: the function needs none."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          position_ids: torch.Tensor | None = None, prefix_tree: PrefixTree | None = None,
                          **_: object) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (1, heads, T, dim), key and value (1, kv_heads, T, dim) of
    one packed row (this rank's slice of it under sequence parallelism), `position_ids` (1, T) restarting at 0 where
    each sequence starts; returns (1, T, heads, dim). `attention_mask` is ignored: the positions say everything.
    With `prefix_tree` (`prefix_sharing.SharedPrefixDecoder` passes it) the row is that tree's: each segment attends
    to its ancestors and causally to itself."""
    if query.shape[0] != 1:
        raise ValueError(f"{PACKED_SDPA} attends over one packed row, got a batch of {query.shape[0]} rows: build "
                         "the model with it only for padding-free micro-batches")
    group, parallel, _rank = sequence_parallel()
    if group is not None and parallel > 1:
        from verl.utils.ulysses import gather_heads_scatter_seq, gather_seq_scatter_heads

        # every rank needs whole kv heads: repeat them until the group can split them (e.g. 1 kv head over 2 ranks)
        repeats = max(parallel // key.shape[1], 1)
        key, value = (t.repeat_interleave(repeats, dim=1) for t in (key, value))
        query, key, value = (gather_seq_scatter_heads(t, seq_dim=2, head_dim=1, group=group)
                             for t in (query, key, value))
        if position_ids is not None:
            slices = [torch.empty_like(position_ids) for _ in range(parallel)]
            torch.distributed.all_gather(slices, position_ids.contiguous(), group=group)
            position_ids = torch.cat(slices, dim=-1)
    if prefix_tree is not None:
        output = tree_attention(query, key, value, prefix_tree, dropout=dropout if module.training else 0.0,
                                scale=scaling)
    else:
        output = torch.cat([
            scaled_dot_product_attention(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                         dropout_p=dropout if module.training else 0.0, is_causal=True,
                                         scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
            for start, end in sequence_bounds(position_ids, query.shape[2])
        ], dim=2)
    if group is not None and parallel > 1:
        output = gather_heads_scatter_seq(output, seq_dim=2, head_dim=1, group=group)
    return output.transpose(1, 2).contiguous(), None


def sequence_bounds(position_ids: torch.Tensor | None, length: int) -> list[tuple[int, int]]:
    """(start, end) of each packed sequence in a row of `length` tokens: a sequence starts where the position is 0
    (the whole row when no positions are given)."""
    if position_ids is None:
        return [(0, length)]
    positions = position_ids.reshape(-1)[:length]
    starts = torch.nonzero(positions == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return list(zip(starts, [*starts[1:], length], strict=True))
