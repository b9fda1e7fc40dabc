"""Trajectory groups → the padded tensor batch verl's TrainingWorker trains on.

Owns: flattening groups into training sequences, outcome advantages per group with verl's
advantage-estimator registry, verl's padded layout, and sharding a batch over data-parallel
workers. Pure functions of their inputs: no Ray, no model. Does not own: log-prob recomputation
or the loss (the trainer workers).

Layout, stated once: `prompts` is left-padded and `responses` right-padded, as in verl; every
per-token tensor (`response_mask`, `advantages`, `behaviour_logprobs`, `versions`) has shape
(num_sequences, response_length) and is aligned to `responses`. "Response" means everything
after a sequence's first prompt: sampled tokens (mask 1) and tokens the environment or template
inserted between calls (mask 0).

Advantages are computed per trajectory, not per sequence: a trajectory's response row is the
concatenation of its sequences' responses, so a multi-sequence trajectory is one sample of its
group and every one of its sequences carries the trajectory's reward and advantages.

An episode with several lineages (`Trajectory.lineages`: sub-agents, compacted contexts, forks) trains as
several sequences and weighs once in the loss whatever their number: each of its k sequences carries
`sequence_weights` 1/k. What each `loss_agg_mode` then means for such an episode:

    token-mean            every trained token weighs the same over the mini-batch: the episode weighs by its
                          trained tokens over all its lineages, as one long episode of the same tokens would
    token-sum             every trained token weighs 1, no normaliser (the same reading)
    seq-mean-token-mean   a sequence's term is its token mean; the episode's is the mean of its lineages'
                          terms (weights 1/k), and the loss the mean over episodes (Σ weights), not sequences
    seq-mean-token-sum    the same with a sequence's token sum (and -norm: divided by verl's constant horizon)

verl's `agg_loss` takes one normaliser for a whole mini-batch and no per-sequence weight, so the seq-mean
modes are weighted on the gradient (`sequence_gradient_scales`, applied by the policy loss): sequence i's
gradient is multiplied by w_i · N / E (N sequences, E = Σ w episodes in the mini-batch, over all ranks), and
the update is exactly that of Σ_i w_i L_i / E. verl's loss metrics (loss, pg_loss, entropy, kl_loss) keep
their plain reading, the mean of the per-sequence terms over the N sequences. With one lineage per episode
every scale is 1 and nothing is applied.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fullasync.infra.offload import drop_piecewise
from fullasync.trainer.prefix_sharing import MIN_SHARED_TOKENS, plan_micro_batches
from fullasync.types import PROMPT_VERSION, TrainingSequence, TrajectoryGroup

PADDING_ROW = -1  # row_index / group_index / trajectory_index of rows added only to fill shapes


@dataclass(frozen=True)
class TrainBatch:
    """Sequences in verl's padded layout plus what the rollout recorded per token (see module doc)."""

    prompts: torch.Tensor  # (N, P) long, left-padded
    responses: torch.Tensor  # (N, R) long, right-padded
    attention_mask: torch.Tensor  # (N, P + R) long, 1 on real tokens
    position_ids: torch.Tensor  # (N, P + R) long
    response_mask: torch.Tensor  # (N, R) long, 1 on tokens the policy sampled (the loss mask)
    advantages: torch.Tensor  # (N, R) float32, 0 where response_mask is 0
    behaviour_logprobs: torch.Tensor  # (N, R) float32, the rollout's log-probs, 0 where response_mask is 0
    versions: torch.Tensor  # (N, R) long, weight version that sampled each token, PROMPT_VERSION elsewhere
    rewards: torch.Tensor  # (N,) float32, reward of the sequence's trajectory
    sequence_weights: torch.Tensor  # (N,) float32, 1/k for each of the k sequences of a trajectory; 0 for fill
    group_index: torch.Tensor  # (N,) long, position of the sequence's group in the input; PADDING_ROW for fill
    trajectory_index: torch.Tensor  # (N,) long, trajectory number over the whole input; PADDING_ROW for fill
    row_index: torch.Tensor  # (N,) long, row in the batch build_batch returned; PADDING_ROW for fill

    def __post_init__(self) -> None:
        n, prompt_width = self.prompts.shape
        response_shape = self.responses.shape
        if response_shape[0] != n:
            raise ValueError(f"TrainBatch: {n} prompts but {response_shape[0]} responses")
        for name in ("response_mask", "advantages", "behaviour_logprobs", "versions"):
            if getattr(self, name).shape != response_shape:
                raise ValueError(f"TrainBatch.{name} must be aligned with responses {tuple(response_shape)}")
        full_shape = (n, prompt_width + response_shape[1])
        for name in ("attention_mask", "position_ids"):
            if tuple(getattr(self, name).shape) != full_shape:
                raise ValueError(f"TrainBatch.{name} must have shape {full_shape}")
        for name in ("rewards", "sequence_weights", "group_index", "trajectory_index", "row_index"):
            if tuple(getattr(self, name).shape) != (n,):
                raise ValueError(f"TrainBatch.{name} must have shape ({n},)")

    @property
    def num_sequences(self) -> int:
        return self.prompts.shape[0]

    @property
    def response_length(self) -> int:
        return self.responses.shape[1]

    @property
    def num_trained_tokens(self) -> int:
        return int(self.response_mask.sum())

    @property
    def num_episodes(self) -> float:
        """Σ sequence_weights: the trajectories with a trained sequence here (fractional where only some of a
        trajectory's sequences are, as in a mini-batch that splits its lineages)."""
        return float(self.sequence_weights.double().sum())

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompts, self.responses], dim=1)

    def select(self, rows: torch.Tensor | np.ndarray | Sequence[int]) -> TrainBatch:
        """The batch restricted to `rows` (in that order)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        return TrainBatch(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})

    def with_fill_rows(self, count: int, pad_token_id: int = 0) -> TrainBatch:
        """Append `count` rows that change nothing: one prompt and one response token, mask 0."""
        if count == 0:
            return self
        n, width = count, self.response_length
        fill = {
            "prompts": torch.full((n, self.prompts.shape[1]), pad_token_id, dtype=torch.long),
            "responses": torch.full((n, width), pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros((n, self.attention_mask.shape[1]), dtype=torch.long),
            "position_ids": torch.zeros((n, self.position_ids.shape[1]), dtype=torch.long),
            "response_mask": torch.zeros((n, width), dtype=torch.long),
            "advantages": torch.zeros((n, width)),
            "behaviour_logprobs": torch.zeros((n, width)),
            "versions": torch.full((n, width), PROMPT_VERSION, dtype=torch.long),
            "rewards": torch.zeros(n),
            "sequence_weights": torch.zeros(n),
            "group_index": torch.full((n,), PADDING_ROW, dtype=torch.long),
            "trajectory_index": torch.full((n,), PADDING_ROW, dtype=torch.long),
            "row_index": torch.full((n,), PADDING_ROW, dtype=torch.long),
        }
        prompt_width = self.prompts.shape[1]
        fill["attention_mask"][:, prompt_width - 1 : prompt_width + 1] = 1
        fill["position_ids"][:, prompt_width] = 1
        return TrainBatch(**{k: torch.cat([getattr(self, k), v]) for k, v in fill.items()})


def build_batch(
    groups: Sequence[TrajectoryGroup],
    *,
    advantage_estimator: str = "grpo",
    norm_adv_by_std_in_grpo: bool = True,
    gamma: float = 1.0,
    pad_token_id: int = 0,
    distill: Distillation | None = None,
) -> TrainBatch:
    """Flatten `groups` into a `TrainBatch` with outcome advantages per group (verl estimator by name).

    Sequences without any sampled token are left out (they would train nothing); their
    trajectories still count in their group's statistics. A trajectory's k sequences left in weigh
    1/k each (`sequence_weights`, see the module doc). Raises ValueError when no sequence is left.
    Sequences a teacher scored train on `distilled_advantages` (`distill`: its weights; default 1 and 1).
    """
    if not groups:
        raise ValueError("build_batch needs at least one TrajectoryGroup")
    per_trajectory = [t.to_sequences() for g in groups for t in g.trajectories]
    group_of = [gi for gi, g in enumerate(groups) for _ in g.trajectories]
    rewards = [t.reward for g in groups for t in g.trajectories]
    advantages = trajectory_advantages(
        per_trajectory, rewards, group_of, advantage_estimator, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        gamma=gamma,
    )
    rows = [
        (sequence, advantage, ti)
        for ti, (sequences, trajectory_advantage) in enumerate(zip(per_trajectory, advantages, strict=True))
        for sequence, advantage in zip(sequences, trajectory_advantage, strict=True)
        if sequence.num_trained_tokens > 0
    ]
    if not rows:
        raise ValueError("build_batch: no sampled tokens in these groups (every model call had an empty output)")
    padded = distilled_advantages([(s, a) for s, a, _ in rows], distill or Distillation())
    batch = _pad_rows(padded, pad_token_id)
    lineages = Counter(ti for _, _, ti in rows)
    batch = dataclasses.replace(
        batch,
        rewards=torch.tensor([rewards[ti] for _, _, ti in rows], dtype=torch.float32),
        sequence_weights=torch.tensor([1.0 / lineages[ti] for _, _, ti in rows], dtype=torch.float32),
        group_index=torch.tensor([group_of[ti] for _, _, ti in rows], dtype=torch.long),
        trajectory_index=torch.tensor([ti for _, _, ti in rows], dtype=torch.long),
    )
    drop_piecewise(padded, rows, advantages, per_trajectory)  # freed in this thread, without a long stall
    return batch


@dataclass(frozen=True)
class Distillation:
    """On-policy distillation's weights: a sampled token's advantage is `task_weight` · its task advantage +
    `kl_weight` · (log p_teacher − log p_behaviour), the negated reverse KL to the teacher at that token."""

    kl_weight: float = 1.0
    task_weight: float = 1.0


def distilled_advantages(rows: Sequence[tuple[TrainingSequence, np.ndarray]],
                         distill: Distillation) -> list[tuple[TrainingSequence, np.ndarray]]:
    """`rows` (a sequence and its task advantages, aligned to its response) with the teacher's term mixed in where a
    teacher scored the sequences; as they are where none did. Sequences of both kinds in one batch raise ValueError:
    a teacher's scoring is never skipped for some episodes (the rollouter scores every group before it is queued)."""
    scored = sum(bool(sequence.teacher_logprobs) for sequence, _ in rows)
    if scored == 0:
        return list(rows)
    if scored != len(rows):
        raise ValueError(f"{scored} of {len(rows)} sequences of the batch carry a teacher's log-probs: the teacher "
                         "scores every group or none")
    mixed = []
    for sequence, advantage in rows:
        p = sequence.prompt_length
        mask = np.array(sequence.loss_mask[p:], dtype=np.float32)
        gap = (np.array(sequence.teacher_logprobs[p:], dtype=np.float32)
               - np.array(sequence.logprobs[p:], dtype=np.float32))
        mixed.append((sequence, (distill.task_weight * advantage + distill.kl_weight * gap * mask).astype(np.float32)))
    return mixed


def loss_normaliser(batch: TrainBatch, loss_agg_mode: str, *, by_episode: bool = True) -> float:
    """What the loss of one update over `batch` (every rank together) divides its summed terms by: its trained
    tokens for token-mean, nothing (1) for token-sum; for the seq-mean modes its episodes (Σ sequence_weights,
    the normaliser of the gradient), or with `by_episode=False` its sequences (verl's own, which its loss
    metrics are means over; see the module doc)."""
    if loss_agg_mode == "token-mean":
        return float(batch.num_trained_tokens)
    if loss_agg_mode.startswith("seq-mean"):
        return batch.num_episodes if by_episode else float(batch.num_sequences)
    return 1.0


def sequence_gradient_scales(block: TrainBatch, loss_agg_mode: str, sequences: int,
                             episodes: float) -> torch.Tensor | None:
    """(rows,) multipliers of each row's gradient in one update whose mini-batch holds `sequences` real
    sequences and `episodes` episodes (Σ sequence_weights) over all ranks: w · sequences / episodes in the
    seq-mean modes, so that verl's mean over sequences becomes the mean over episodes (module doc); None where
    every multiplier is 1 (token modes, one lineage per episode)."""
    if not loss_agg_mode.startswith("seq-mean") or episodes <= 0:
        return None
    scales = block.sequence_weights * (sequences / episodes)
    real = block.row_index != PADDING_ROW
    if bool((scales[real] == 1.0).all()):
        return None
    return scales


def trajectory_advantages(
    per_trajectory: Sequence[Sequence[TrainingSequence]],
    rewards: Sequence[float],
    group_of: Sequence[int],
    estimator_name: str,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    gamma: float = 1.0,
) -> list[list[np.ndarray]]:
    """Per-token advantages of each sequence's response, from one estimator call over all trajectories.

    Row t of the estimator's input is trajectory t's responses concatenated; its outcome reward
    sits on its last sampled token; `index` is the group. Returns, per trajectory, one float32
    array per sequence, aligned to that sequence's response.
    """
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    response_masks = [[np.array(s.loss_mask[s.prompt_length :], dtype=np.float32) for s in seqs]
                      for seqs in per_trajectory]
    lengths = [sum(len(m) for m in masks) for masks in response_masks]
    mask = np.zeros((len(response_masks), max(1, max(lengths))), dtype=np.float32)
    token_rewards = np.zeros_like(mask)
    for t, masks in enumerate(response_masks):
        row = np.concatenate(masks) if masks else mask[t, :0]
        mask[t, : len(row)] = row
        sampled = np.flatnonzero(row)
        token_rewards[t, int(sampled[-1]) if len(sampled) else max(len(row) - 1, 0)] = rewards[t]
    config = AlgoConfig(gamma=gamma, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, adv_estimator=estimator_name)
    estimator = get_adv_estimator_fn(estimator_name)
    inputs = {
        "token_level_rewards": torch.from_numpy(token_rewards),
        "response_mask": torch.from_numpy(mask),
        "index": np.array(group_of, dtype=object),
        "config": config,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
    }
    advantages, _ = estimator(**_accepted_inputs(estimator, inputs))
    per_token = advantages.float().numpy() * mask
    return [np.split(per_token[t, : lengths[t]], np.cumsum([len(m) for m in masks])[:-1]) if masks else []
            for t, masks in enumerate(response_masks)]


def _accepted_inputs(estimator: Callable[..., object], inputs: dict[str, object]) -> dict[str, object]:
    """The subset of `inputs` the estimator's signature takes (all of them if it has **kwargs)."""
    parameters = inspect.signature(estimator).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return dict(inputs)
    return {k: v for k, v in inputs.items() if k in parameters}


def _pad_rows(rows: Sequence[tuple[TrainingSequence, np.ndarray]], pad_token_id: int) -> TrainBatch:
    """Left-pad prompts and right-pad responses of `rows` into verl's layout.

    Filled with numpy, one row at a time, and turned into tensors once at the end: a torch call per row lets go of
    the interpreter lock and takes it back at once, and a loop of 8,192 such calls in a worker thread kept the event
    loop from running for up to 0.4 s at a time (`bench/step_off_loop.py`); numpy keeps the lock for each short fill
    and the thread hands it over at the interpreter's switch interval. No whole-batch pass either (a cumulative sum
    over 8,192 × 2,304 positions held the lock 0.1 s): positions are filled row by row."""
    n = len(rows)
    prompt_width = max(s.prompt_length for s, _ in rows)
    width = max(len(s.token_ids) - s.prompt_length for s, _ in rows)
    prompts = np.full((n, prompt_width), pad_token_id, dtype=np.int64)
    responses = np.full((n, width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((n, prompt_width + width), dtype=np.int64)
    response_mask = np.zeros((n, width), dtype=np.int64)
    advantages = np.zeros((n, width), dtype=np.float32)
    behaviour = np.zeros((n, width), dtype=np.float32)
    versions = np.full((n, width), PROMPT_VERSION, dtype=np.int64)
    position_ids = np.zeros((n, prompt_width + width), dtype=np.int64)
    for i, (sequence, advantage) in enumerate(rows):
        p, r = sequence.prompt_length, len(sequence.token_ids) - sequence.prompt_length
        prompts[i, prompt_width - p :] = sequence.token_ids[:p]
        attention_mask[i, prompt_width - p : prompt_width + r] = 1
        position_ids[i, prompt_width - p : prompt_width + r] = np.arange(p + r)
        position_ids[i, prompt_width + r :] = max(p + r - 1, 0)  # 0 on the left padding, the last position after
        if r == 0:
            continue
        responses[i, :r] = sequence.token_ids[p:]
        mask = np.array(sequence.loss_mask[p:], dtype=np.int64)
        response_mask[i, :r] = mask
        advantages[i, :r] = advantage * mask
        behaviour[i, :r] = np.array(sequence.logprobs[p:], dtype=np.float32) * mask
        versions[i, :r] = sequence.versions[p:]
    return TrainBatch(
        prompts=torch.from_numpy(prompts),
        responses=torch.from_numpy(responses),
        attention_mask=torch.from_numpy(attention_mask),
        position_ids=torch.from_numpy(position_ids),
        response_mask=torch.from_numpy(response_mask),
        advantages=torch.from_numpy(advantages),
        behaviour_logprobs=torch.from_numpy(behaviour),
        versions=torch.from_numpy(versions),
        rewards=torch.zeros(n),
        sequence_weights=torch.ones(n),
        group_index=torch.zeros(n, dtype=torch.long),
        trajectory_index=torch.zeros(n, dtype=torch.long),
        row_index=torch.arange(n),
    )


@dataclass(frozen=True)
class ShardedBatch:
    """A batch laid out for `num_workers` data-parallel workers and `mini_batches` updates.

    `shards[w]` is worker w's rows: `mini_batches` consecutive blocks of `rows_per_block` rows,
    block j holding worker w's part of mini-batch j (fill rows complete the block).
    `sequences_per_mini_batch[j]` counts mini-batch j's real rows over all workers,
    `episodes_per_mini_batch[j]` their episodes (Σ sequence_weights). `micro_batch_rows` > 0: the blocks were planned
    into micro-batches of that many rows each (`plan_micro_batches`), which the workers pass in that order.
    """

    shards: list[TrainBatch]
    rows_per_block: int
    sequences_per_mini_batch: list[int]
    episodes_per_mini_batch: list[float]
    micro_batch_rows: int = 0


def shard_batch(
    batch: TrainBatch, num_workers: int, mini_batches: int, micro_batch_size: int, pad_token_id: int = 0,
    shared_budget: int = 0, counted_once: bool = True,
) -> ShardedBatch:
    """Split `batch` into mini-batches (consecutive rows) and each mini-batch over the workers.

    Every block is padded to the same multiple of `micro_batch_size` (verl's fixed micro-batches
    must divide it), so every worker runs the same number of micro-batches: collectives line up.
    With `shared_budget` (tokens; shared prefixes counted once) each block is planned into micro-batches that keep
    common prefixes together (`prefix_sharing.plan_micro_batches`), each filled to the largest plan's rows; with
    `counted_once` false a shared prefix counts against the budget in each sequence (what holds the whole logits).
    """
    if batch.num_sequences < mini_batches:
        raise ValueError(
            f"a batch of {batch.num_sequences} sequences cannot be split into {mini_batches} mini-batches; "
            f"lower TrainerConfig.mini_batches or train on larger batches"
        )
    mini = np.array_split(np.arange(batch.num_sequences), mini_batches)
    parts = [[np.array_split(rows, num_workers)[w] for rows in mini] for w in range(num_workers)]
    episodes = [float(batch.sequence_weights[torch.from_numpy(rows)].double().sum()) for rows in mini]
    if shared_budget:
        return _planned_shards(batch, parts, (shared_budget, counted_once), pad_token_id,
                               ([len(rows) for rows in mini], episodes))
    largest = max(len(part) for blocks in parts for part in blocks)
    rows_per_block = math.ceil(largest / micro_batch_size) * micro_batch_size
    shards = []
    for blocks in parts:
        pieces = [batch.select(part).with_fill_rows(rows_per_block - len(part), pad_token_id) for part in blocks]
        shards.append(_concat(pieces))
    return ShardedBatch(shards, rows_per_block, [len(rows) for rows in mini], episodes)


def _planned_shards(batch: TrainBatch, parts: list[list[np.ndarray]], budget: tuple[int, bool], pad_token_id: int,
                    sizes: tuple[list[int], list[float]]) -> ShardedBatch:
    """`shard_batch` with each block planned into micro-batches of shared prefixes: every micro-batch filled to the
    largest plan's rows and every block to the most micro-batches any block has (collectives line up)."""
    real = batch.attention_mask.bool()
    tokens = [batch.input_ids[i][real[i]].numpy() for i in range(batch.num_sequences)]
    tokens_per_pass, counted_once = budget
    min_shared = MIN_SHARED_TOKENS if counted_once else max(len(t) for t in tokens) + 1
    plans = [[[part[i] for i in micro]
              for micro in plan_micro_batches([tokens[r] for r in part], tokens_per_pass, min_shared)]
             for blocks in parts for part in blocks]
    rows = max(len(micro) for plan in plans for micro in plan)
    count = max(len(plan) for plan in plans)
    empty = batch.select([])
    shards = []
    for w, blocks in enumerate(parts):
        pieces = []
        for plan in plans[w * len(blocks):(w + 1) * len(blocks)]:
            pieces += [batch.select(micro).with_fill_rows(rows - len(micro), pad_token_id) for micro in plan]
            pieces += [empty.with_fill_rows(rows, pad_token_id)] * (count - len(plan))
        shards.append(_concat(pieces))
    return ShardedBatch(shards, rows * count, *sizes, micro_batch_rows=rows)


def _concat(batches: Sequence[TrainBatch]) -> TrainBatch:
    fields = dataclasses.fields(TrainBatch)
    return TrainBatch(**{f.name: torch.cat([getattr(b, f.name) for b in batches]) for f in fields})
