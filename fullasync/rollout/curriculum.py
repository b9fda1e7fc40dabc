"""Which row the rollouter runs next when rows are sampled by their recent results (`data.curriculum=pass_rate`).

Owns: the rows' pools by recent pass rate (`unseen`, `learning`, `solved`: every recent episode passed, `unsolved`:
none did), sampling a pool by its weight (each non-empty pool gets at least `floor` of the draws) and a row in it
uniformly, the draws not yet settled (a resumed run runs them first), and the sampler's whole state as JSON for the
checkpoint: a resumed run, fed the same results, draws the same rows. Does not own: admission, the row's episodes or
its outcome (`Rollouter` settles each draw when the ledger records the row's outcome, in the same instant).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from fullasync.types import JsonValue

POOLS = ("unseen", "learning", "solved", "unsolved")


@dataclass(frozen=True)
class CurriculumSettings:
    weights: Mapping[str, float] = field(default_factory=lambda: {"unseen": 1.0, "learning": 1.0, "solved": 0.2,
                                                                 "unsolved": 0.2})
    floor: float = 0.02  # each non-empty pool's least share of the draws
    window: int = 8  # a row's most recent episodes that decide its pool
    pass_reward: float = 0.5  # an episode passed when its reward is at least this
    draws: int = 0  # rows drawn in all (the run's row budget: data.epochs × the dataset)
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(POOLS)
        if unknown:
            raise ValueError(f"curriculum weights name pools {sorted(unknown)}; the pools are {list(POOLS)}")
        if any(w < 0 for w in self.weights.values()) or not any(self.weights.get(p, 0) > 0 for p in POOLS):
            raise ValueError(f"curriculum weights must be >= 0 and one of them > 0, got {dict(self.weights)}")
        if not 0 <= self.floor < 1 / len(POOLS):
            raise ValueError(f"the curriculum floor must be in [0, {1 / len(POOLS)}), got {self.floor}")
        if self.window < 1:
            raise ValueError(f"the curriculum window must be >= 1 episode, got {self.window}")


def pool_of(passed: Sequence[bool]) -> str:
    """A row's pool by whether its episodes passed: unseen (none ran), solved (all passed), unsolved (none did),
    learning (some did)."""
    if not passed:
        return "unseen"
    count = sum(passed)
    return "solved" if count == len(passed) else "unsolved" if count == 0 else "learning"


def rows_in_pools(rows: Sequence[object], row_rewards: Sequence[Sequence[float]], pools: Sequence[str],
                  pass_reward: float) -> list[object]:
    """The rows whose episodes' rewards put them in `pools` (`fullasync eval`'s `eval_keep`: a dataset of the rows
    a policy sometimes solves, say)."""
    unknown = set(pools) - set(POOLS[1:])
    if unknown:
        raise ValueError(f"eval_keep names {sorted(unknown)}; keep any of {list(POOLS[1:])}")
    return [row for row, rewards in zip(rows, row_rewards, strict=True)
            if pool_of([reward >= pass_reward for reward in rewards]) in pools]


class Curriculum:
    """An iterable of `(draw id, row)` over `rows` (`(row id, row)` pairs), each draw `<row id>#<n>`."""

    def __init__(self, rows: Sequence[tuple[str, object]], settings: CurriculumSettings) -> None:
        if not rows:
            raise ValueError("a curriculum needs rows to sample")
        self.rows = list(rows)
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.drawn = 0
        self.results: list[deque[bool]] = [deque(maxlen=settings.window) for _ in self.rows]
        self.pools: dict[str, list[int]] = {pool: [] for pool in POOLS}
        self.pools["unseen"] = list(range(len(self.rows)))
        self.where: dict[int, tuple[str, int]] = {i: ("unseen", i) for i in range(len(self.rows))}
        self.pending: dict[str, int] = {}  # draws not settled yet: draw id -> row index, in draw order

    def __iter__(self) -> Iterator[tuple[str, object]]:
        for draw_id, index in list(self.pending.items()):  # a resumed run's unsettled draws first
            yield draw_id, self.rows[index][1]
        while self.drawn < self.settings.draws:
            index = self._sample()
            draw_id = f"{self.rows[index][0]}#{self.drawn}"
            self.drawn += 1
            self.pending[draw_id] = index
            yield draw_id, self.rows[index][1]

    def settle(self, draw_id: str, rewards: Sequence[float] | None) -> None:
        """The draw's row ended: with its episodes' rewards (its pool follows them), or none (failed, stopped)."""
        index = self.pending.pop(draw_id, None)
        if index is None or not rewards:
            return
        self.results[index].extend(reward >= self.settings.pass_reward for reward in rewards)
        self._move(index, pool_of(self.results[index]))

    def pool_sizes(self) -> dict[str, int]:
        return {pool: len(members) for pool, members in self.pools.items()}

    def _move(self, index: int, pool: str) -> None:
        old, at = self.where[index]
        if old == pool:
            return
        members = self.pools[old]
        last = members.pop()  # swap-remove: O(1), the order deterministic
        if last != index:
            members[at] = last
            self.where[last] = (old, at)
        self.where[index] = (pool, len(self.pools[pool]))
        self.pools[pool].append(index)

    def _shares(self) -> dict[str, float]:
        mass = {p: self.settings.weights.get(p, 0.0) * len(self.pools[p]) for p in POOLS if self.pools[p]}
        total = sum(mass.values())
        shares = {p: (m / total if total else 1 / len(mass)) for p, m in mass.items()}
        floored = {p: max(share, self.settings.floor) for p, share in shares.items()}
        scale = sum(floored.values())
        return {p: share / scale for p, share in floored.items()}

    def _sample(self) -> int:
        shares = self._shares()
        point, chosen = self.rng.random(), next(iter(shares))
        for pool, share in shares.items():
            chosen = pool  # the last pool when rounding leaves the point at the end
            point -= share
            if point < 0:
                break
        members = self.pools[chosen]
        return members[self.rng.randrange(len(members))]

    # -- the checkpoint's part ---------------------------------------------------------------------------------

    def state(self) -> dict[str, JsonValue]:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "drawn": self.drawn,
                "results": [[int(r) for r in results] for results in self.results],
                "pools": {pool: list(members) for pool, members in self.pools.items()},
                "pending": dict(self.pending), "rows": len(self.rows)}

    def restore(self, state: Mapping[str, object]) -> None:
        """Continue from `state` (before the first draw); the dataset must be the one it was taken on."""
        if state.get("rows") != len(self.rows):
            raise ValueError(f"the checkpoint's curriculum sampled {state.get('rows')} rows, this dataset has "
                             f"{len(self.rows)}: resume with the dataset the run started with")
        version, internal, gauss = _items(state["rng"])
        self.rng.setstate((version, tuple(_items(internal)), gauss))
        self.drawn = _int(state["drawn"])
        for index, results in enumerate(_items(state["results"])):
            self.results[index].clear()
            self.results[index].extend(bool(r) for r in _items(results))
        pools = state["pools"]
        if not isinstance(pools, Mapping):
            raise ValueError(f"a curriculum state's pools are a mapping, got {pools!r}")
        self.pools = {str(pool): [_int(i) for i in _items(members)] for pool, members in pools.items()}
        self.where = {index: (pool, at) for pool, members in self.pools.items() for at, index in enumerate(members)}
        pending = state["pending"]
        if not isinstance(pending, Mapping):
            raise ValueError(f"a curriculum state's pending draws are a mapping, got {pending!r}")
        self.pending = {str(draw_id): _int(index) for draw_id, index in pending.items()}


def _items(value: object) -> list[object]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"a curriculum state holds a list here, got {value!r}")
    return list(value)


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ValueError(f"a curriculum state holds an integer here, got {value!r}")
    return value
