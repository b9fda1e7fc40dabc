"""Workloads for the simulation: response lengths, device counts, costs — and their throughput bound.

Owns: `Workload` (every parameter of a simulated run, documented), the deterministic response
length of each episode, and `analytic_bound`, the best throughput any schedule can reach on the
workload when generation and training run on separate devices.

The bound (per train step of S = B·n samples; G generation devices, T = N − G training devices):

    E[L]     mean response length: L = min(cap, median · exp(σ Z)), Z ~ N(0, 1)
    W_gen    = S · (E[L] · τ(m) / m + p · P)       device-seconds to generate one batch at full batch m
    t_gen    = W_gen / G
    t_train  = o + c · S · (P + E[L]) / T           (o: per-step overhead, c: device-seconds per token)

An agentic workload has K turns per episode (K lognormal, rounded, clamped to 1..max_turns), each
a call whose prompt is the previous call's prompt + output + `observation_tokens` of tool output,
after a tool latency. Then E[L] above is the output of a whole episode, E[K]·E[L_turn]; P · p
becomes the prefill of every turn's prompt, E[K]·P + E[K(K−1)/2]·(E[L_turn] + O); trained tokens
per sample are P + E[K]·E[L_turn] + (E[K] − 1)·O (the turns merge into one sequence). Tool latency
is absent from the bound: enough concurrent episodes hide it.
    t_push   = push time (generation is paused and the trainer blocked while weights move)
    X(G)     = S / (t_push + max(t_gen, t_train))   samples/s
    bound    = max over G in 1..N−1 of X(G)

Assumptions: every generation device decodes a full batch of m sequences at all times (no long-
tail drain, no admission stall), every generated token is trained once (no drops, no re-prefill
after an interrupt), and training and generation overlap perfectly except for the push. It is an
upper bound: each assumption can only remove time. `sync` (all N devices generate, then all N
train) is bounded by S / (W_gen/N + t_train(N) + t_push) even without a long tail, which is ≤ the
split bound up to integer rounding of G.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from fullasync.sim.engine import DecodeCost
from fullasync.sim.trainer import TrainCost


@functools.lru_cache(maxsize=1 << 16)
def _normal(key: str) -> float:
    """A standard normal draw determined by `key` (cached: an episode's lengths are asked for several times,
    and seeding a generator from a string hashes it with SHA-512)."""
    return random.Random(key).gauss(0.0, 1.0)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class Workload:
    """One simulated RL workload. Times are seconds of the simulated clock."""

    name: str
    devices: int = 16  # N: devices shared by generation and training
    batch_groups: int = 128  # B: groups (prompts) per train step
    group_size: int = 8  # n: responses per prompt
    prompt_tokens: int = 256  # P: prompt length (all prompts alike)
    median_length: int = 256  # median response length in tokens
    length_sigma: float = 1.0  # σ of log(length): 1.0 gives a long right tail
    cap_multiple: int = 8  # responses are cut at cap_multiple × median (the max_tokens of the task)
    decode: DecodeCost = field(default_factory=DecodeCost)
    train: TrainCost = field(default_factory=TrainCost)
    seed: int = 0
    turns_median: float = 1.0  # model calls per episode (median; lognormal, rounded); 1 = single turn
    turns_sigma: float = 0.0  # σ of log(turns)
    max_turns: int = 1  # turns are clamped to 1..max_turns
    observation_tokens: int = 0  # tool output appended to the context after each turn but the last
    tool_latency_s: float = 0.0  # median seconds of a tool call between two turns (lognormal)
    tool_latency_sigma: float = 0.0

    @property
    def cap(self) -> int:
        return self.cap_multiple * self.median_length

    @property
    def samples_per_step(self) -> int:
        return self.batch_groups * self.group_size

    def length(self, episode_id: str) -> int:
        """The response length of one episode: deterministic, so every mode sees the same samples."""
        z = _normal(f"{self.seed}/{episode_id}")
        return max(1, min(self.cap, round(self.median_length * math.exp(self.length_sigma * z))))

    def turns(self, episode_id: str) -> int:
        """Model calls of one episode (1 for a single-turn workload)."""
        if self.max_turns == 1:
            return 1
        z = _normal(f"{self.seed}/turns/{episode_id}")
        return max(1, min(self.max_turns, round(self.turns_median * math.exp(self.turns_sigma * z))))

    def turn_length(self, episode_id: str, turn: int) -> int:
        """The response length of one turn (turn 0 of an episode is `length(episode_id)`)."""
        return self.length(episode_id if turn == 0 else f"{episode_id}#{turn}")

    def tool_latency(self, episode_id: str, turn: int) -> float:
        """Seconds of the tool call before `turn` (≥ 1)."""
        z = _normal(f"{self.seed}/tool/{episode_id}#{turn}")
        return self.tool_latency_s * math.exp(self.tool_latency_sigma * z)

    def output_tokens(self, episode_id: str) -> int:
        """Tokens generated over all turns of one episode."""
        return sum(self.turn_length(episode_id, turn) for turn in range(self.turns(episode_id)))

    @property
    def max_context(self) -> int:
        """The longest prompt + output of any call."""
        return self.prompt_tokens + self.max_turns * self.cap + (self.max_turns - 1) * self.observation_tokens

    def turn_moments(self) -> tuple[float, float]:
        """(E[K], E[K(K − 1)/2]) of the turn count K, from its rounded, clamped lognormal."""
        if self.max_turns == 1:
            return 1.0, 0.0
        if self.turns_sigma == 0:
            k = max(1, min(self.max_turns, round(self.turns_median)))
            return float(k), k * (k - 1) / 2
        mean = pairs = 0.0
        for k in range(1, self.max_turns + 1):
            low = -math.inf if k == 1 else (math.log((k - 0.5) / self.turns_median) / self.turns_sigma)
            high = math.inf if k == self.max_turns else (math.log((k + 0.5) / self.turns_median) / self.turns_sigma)
            p = (_normal_cdf(high) if high != math.inf else 1.0) - (_normal_cdf(low) if low != -math.inf else 0.0)
            mean += p * k
            pairs += p * k * (k - 1) / 2
        return mean, pairs

    def mean_output_tokens(self) -> float:
        """E[tokens generated per sample] (E[L] for a single-turn workload)."""
        return self.turn_moments()[0] * self.mean_length()

    def mean_prefill_tokens(self) -> float:
        """E[prompt tokens prefilled per sample], every turn's prompt counted once."""
        turns, pairs = self.turn_moments()
        return turns * self.prompt_tokens + pairs * (self.mean_length() + self.observation_tokens)

    def mean_trained_tokens(self) -> float:
        """E[tokens of a sample's training sequence] (P + E[L] for a single-turn workload)."""
        turns = self.turn_moments()[0]
        return self.prompt_tokens + turns * self.mean_length() + (turns - 1) * self.observation_tokens

    def mean_length(self) -> float:
        """E[min(cap, median · exp(σZ))], in closed form."""
        m, s, c = self.median_length, self.length_sigma, float(self.cap)
        below = m * math.exp(s * s / 2) * _normal_cdf((math.log(c / m) - s * s) / s)
        return below + c * (1.0 - _normal_cdf(math.log(c / m) / s))

    def with_(self, **changes: Any) -> Workload:
        return replace(self, **changes)


@dataclass(frozen=True)
class BoundTerms:
    """The terms of the bound for one split (seconds per train step)."""

    gen_devices: int
    train_devices: int
    gen_s: float
    train_s: float
    push_s: float

    @property
    def step_s(self) -> float:
        return self.push_s + max(self.gen_s, self.train_s)

    @property
    def limited_by(self) -> str:
        return "generation" if self.gen_s >= self.train_s else "training"


def bound_terms(workload: Workload, gen_devices: int) -> BoundTerms:
    w, d = workload, workload.decode
    samples = w.samples_per_step
    gen_work = samples * (w.mean_output_tokens() * d.seconds_per_token_at_capacity()
                          + d.prefill_per_token_s * w.mean_prefill_tokens())
    train_devices = w.devices - gen_devices
    trained_tokens = samples * w.mean_trained_tokens()
    return BoundTerms(gen_devices, train_devices, gen_work / gen_devices,
                      w.train.step_s(round(trained_tokens), train_devices), d.push_s)


def split_bound(workload: Workload, gen_devices: int) -> float:
    """X(G) of the module docstring, samples/s."""
    return workload.samples_per_step / bound_terms(workload, gen_devices).step_s


def analytic_bound(workload: Workload) -> tuple[float, int]:
    """(bound in samples/s, the split G that reaches it)."""
    return max((split_bound(workload, g), g) for g in range(1, workload.devices))


def sync_bound_without_tail(workload: Workload) -> float:
    """What `sync` would reach if every batch decoded at full occupancy to the end (no long tail)."""
    all_gen = bound_terms(workload, workload.devices - 1)  # gen_s scaled below to N devices
    gen_s = all_gen.gen_s * (workload.devices - 1) / workload.devices
    train_s = workload.train.step_s(round(workload.samples_per_step * workload.mean_trained_tokens()), workload.devices)
    return workload.samples_per_step / (gen_s + train_s + workload.decode.push_s)


LONG_TAIL = Workload(
    # Long-reasoning RL, scaled down in tokens so that a sweep fits on two CPU cores: lengths
    # lognormal with median 256 and σ = 1.0 (mean ≈ 401), cut at 8× the median (1.9 % of the
    # responses hit the cap, so every batch of 1024 has ~20 of them). A decode step costs
    # 20 ms + 0.2 ms per running sequence (memory-bound: one sequence alone decodes at 49 tok/s,
    # a full batch of 32 at 1212 tok/s), prefill is 41× cheaper per token than a decode token at
    # full batch, training costs 1e-4 device-seconds per token, a weight push 1 s.
    name="long-tail",
)

UNIFORM = Workload(
    # Same costs, lengths concentrated around the median (σ = 0.25, cap 2×): little long tail.
    name="short-uniform",
    length_sigma=0.25,
    cap_multiple=2,
)

AGENTIC = Workload(
    # Multi-turn tool use, scaled down like the others: turns lognormal with median 3 and σ = 0.5
    # (1–8 turns, mean ≈ 3.3), each turn's response lognormal with median 96 and σ = 0.8 cut at 384,
    # 32 tokens of tool output appended after every turn but the last, and a tool call of median
    # 2 s (σ = 1.0: one in twenty takes over 10 s) between turns, during which the episode holds no
    # engine slot. P = 128 and B = 64 groups keep the simulation's own CPU (its prompts grow every
    # turn) within a couple of minutes per run; devices and costs as `long-tail`.
    name="agentic",
    batch_groups=64,
    prompt_tokens=128,
    median_length=96,
    length_sigma=0.8,
    cap_multiple=4,
    turns_median=3.0,
    turns_sigma=0.5,
    max_turns=8,
    observation_tokens=32,
    tool_latency_s=2.0,
    tool_latency_sigma=1.0,
)

PRESETS = {w.name: w for w in (LONG_TAIL, UNIFORM, AGENTIC)}
