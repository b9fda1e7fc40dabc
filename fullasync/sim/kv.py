"""`PrefixCache`: a simulated engine's KV cache, block by block, with prefix caching and eviction as vLLM does it.

Owns: which token blocks an engine holds and what admitting a request costs in them. The cache has `capacity`
blocks of `block_size` tokens. A full block is known by a hash chained over every token before it (a block
matches only where the whole prefix does), as vLLM's automatic prefix caching keys them. A request is admitted
with the longest run of its prompt's blocks already cached (those tokens are not prefilled again), plus new blocks
for the rest of its prompt and for the tokens it will generate; blocks held by running requests are shared
(reference-counted, counted once). When a request ends, the full blocks it computed stay cached but free: the
least recently used of them are evicted first when a request needs room (a request's blocks are freed tail first,
so its prefix outlives its tail, as in vLLM). A request that does not fit, even after
evicting every free block, waits (the engine admits nothing past it). A weight push makes every cached block stale
(`invalidate`): blocks of the new weights are never matched against those of the old.

Simplification, stated: a request reserves its generation's blocks at admission (vLLM allocates them as tokens
come and preempts a running request when it runs out); with `ignore_eos` targets, as the simulator's requests
have, the two hold the same blocks at the end of each request.
Does not own: time (the engine charges prefill for the uncached tokens), scheduling order (the engine's).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class KVCounters:
    """What the cache saw; `hit_rate` is vLLM's prefix-cache hit rate (hit tokens over queried prompt tokens)."""

    queried_tokens: int = 0  # prompt tokens of admitted requests
    hit_tokens: int = 0  # of which found cached (not prefilled again)
    evicted_blocks: int = 0  # free cached blocks dropped to make room
    refused: int = 0  # admissions tried and refused for want of room (the request waited)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


@dataclass
class _Held:
    shared: list[int] = field(default_factory=list)  # hashes of the full prompt blocks it holds (cached or computed)
    private: int = 0  # blocks only it holds: the prompt's partial block and its generation's
    generation: int = 0  # the cache's weight generation at admission


class PrefixCache:
    """The block-granular KV cache of one engine (see the module docstring)."""

    def __init__(self, capacity: int, block_size: int = 16) -> None:
        if capacity < 1 or block_size < 1:
            raise ValueError(f"PrefixCache needs capacity >= 1 and block_size >= 1 (got {capacity}, {block_size})")
        self.capacity = capacity
        self.block_size = block_size
        self.counters = KVCounters()
        self._refs: dict[int, int] = {}  # hash -> running requests holding that full block
        self._free: OrderedDict[int, None] = OrderedDict()  # cached, held by none: least recently used first
        self._private = 0
        self._held: dict[str, _Held] = {}
        self._generation = 0

    @property
    def used(self) -> int:
        """Blocks held by running requests (a shared block once)."""
        return len(self._refs) + self._private

    @property
    def cached_free(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def hashes(self, ids: Sequence[int]) -> list[int]:
        """The chained hashes of the full blocks of `ids` (under the current weights)."""
        chain, out = hash(("weights", self._generation)), []
        size = self.block_size
        for start in range(0, len(ids) - size + 1, size):
            chain = hash((chain, tuple(ids[start:start + size])))
            out.append(chain)
        return out

    def cached_prefix_tokens(self, prompt_ids: Sequence[int]) -> int:
        """Tokens of `prompt_ids` a request admitted now would find cached (nothing changes)."""
        return self._hits(self.hashes(prompt_ids)) * self.block_size

    def admit(self, request_id: str, prompt_ids: Sequence[int], generate: int) -> int | None:
        """Hold blocks for `prompt_ids` and `generate` more tokens: the prompt tokens found cached, or None when the
        request does not fit even after evicting every free block (nothing changes then)."""
        hashes = self.hashes(prompt_ids)
        hits = self._hits(hashes)  # only an unbroken run from the start is reused; blocks past a miss are computed
        private = self.blocks_for(len(prompt_ids) + generate) - len(hashes)
        newly_held = sum(1 for h in hashes if h not in self._refs)  # computed now, or cached free taken back
        if self.used + newly_held + private > self.capacity:
            self.counters.refused += 1
            return None
        for h in hashes:
            self._free.pop(h, None)
            self._refs[h] = self._refs.get(h, 0) + 1
        self._private += private
        self._evict_beyond_capacity()
        self._held[request_id] = _Held(hashes, private, self._generation)
        self.counters.queried_tokens += len(prompt_ids)
        self.counters.hit_tokens += hits * self.block_size
        return hits * self.block_size

    def release(self, request_id: str, computed_ids: Sequence[int] = ()) -> None:
        """The request ended having computed `computed_ids` (prompt and generated tokens): its full blocks stay cached
        (most recently used), the rest are freed. Unknown ids are ignored (a request never admitted)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return
        self._private -= held.private
        freed = []
        for h in held.shared:
            self._refs[h] -= 1
            if self._refs[h] == 0:
                del self._refs[h]
                freed.append(h)
        if held.generation != self._generation:  # computed under older weights: freed, not cached
            return
        freed += [h for h in self.hashes(computed_ids)[len(held.shared):] if h not in self._refs]  # generated ones
        for h in reversed(freed):  # the tail is evicted first, the prefix that others share last (as vLLM frees)
            self._free[h] = None
            self._free.move_to_end(h)
        self._evict_beyond_capacity()

    def invalidate(self) -> None:
        """New weights: no block computed before matches a request after (running requests keep theirs until
        they end, then free them uncached)."""
        self._generation += 1
        self.counters.evicted_blocks += len(self._free)
        self._free.clear()

    def _hits(self, hashes: list[int]) -> int:
        count = 0
        for h in hashes:
            if h not in self._refs and h not in self._free:
                break
            count += 1
        return count

    def _evict_beyond_capacity(self) -> None:
        while self._free and self.used + len(self._free) > self.capacity:
            self._free.popitem(last=False)
            self.counters.evicted_blocks += 1
