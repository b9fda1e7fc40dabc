"""Rewards given after the episodes: a harness's `CustomGenerator.group_rewards`, applied to a row's group, and its
`CustomGenerator.reward`, applied to each training episode as it ends (`reward_fn(judge, row, trajectory)`).

Owns: calling the group hook once a row's episodes have ended (within `rollout.episode_timeout_s`, again after a
failure up to `rollout.infra_retries` times), checking what the hooks returned (finite numbers: one per trajectory),
and the trajectories with those rewards (each keeping its episode's own in `metadata["episode_reward"]`). A group hook
that keeps failing fails the row: counted with its reason, never a reward; an episode hook's failure is its episode's
(`Rollouter`: a judge that did not answer is the infrastructure's, the episode runs again). Does not own: when a
group is complete or where it goes (`Rollouter`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Sequence

from fullasync.client import RolloutClient
from fullasync.errors import FailureKind
from fullasync.rollout.generator import CustomGenerator
from fullasync.rollout.ledger import FailureLog
from fullasync.types import Trajectory

GROUP_SCORING = -1  # the "episode" a failure of the group's scoring is recorded under

log = logging.getLogger("fullasync")


class MalformedRewardError(TypeError):
    """A reward hook returned something other than finite numbers (`group_rewards`: one per trajectory): a bug, not
    retried."""


def with_group_rewards(trajectories: Sequence[Trajectory], rewards: Sequence[float]) -> tuple[Trajectory, ...]:
    """`trajectories` with `rewards`, in order; MalformedRewardError saying what is wrong with `rewards`."""
    if isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence):
        raise MalformedRewardError(f"group_rewards must return a sequence of floats (or None), got "
                                f"{type(rewards).__name__}")
    if len(rewards) != len(trajectories):
        raise MalformedRewardError(f"group_rewards returned {len(rewards)} reward(s) for {len(trajectories)} "
                                "trajectories: return one per trajectory, in the order given")
    for index, reward in enumerate(rewards):
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise MalformedRewardError(f"group_rewards' reward {index} is {reward!r}: every reward must be a finite "
                                    "number")
    return tuple(_rescored(trajectory, reward) for trajectory, reward in zip(trajectories, rewards, strict=True))


def _rescored(trajectory: Trajectory, reward: float) -> Trajectory:
    return dataclasses.replace(trajectory, reward=float(reward),
                               metadata={**trajectory.metadata, "episode_reward": trajectory.reward})


async def rewarded(generator: CustomGenerator, client: RolloutClient, row: object,
                   trajectory: Trajectory) -> Trajectory:
    """`trajectory` with the reward `generator.reward` gives it after its episode (unchanged when that is None);
    MalformedRewardError when it is no finite number."""
    reward = await generator.reward(client, row, trajectory)
    if reward is None:
        return trajectory
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise MalformedRewardError(f"reward_fn returned {reward!r} for episode {client.episode.id}: return a finite "
                                "number (raise an InfraError when the judge could not score it: it runs again)")
    return _rescored(trajectory, reward)


async def group_scored(generator: CustomGenerator, row_id: str, row: object, trajectories: Sequence[Trajectory],
                       timeout_s: float, retries: int, failures: FailureLog) -> tuple[Trajectory, ...] | None:
    """The group's trajectories with the rewards `generator` gives them together, or as they are when it scores
    episodes one by one; None when its scoring failed `retries` + 1 times or returned a malformed answer."""
    if not generator.scores_groups:
        return tuple(trajectories)
    for attempt in range(retries + 1):
        try:
            async with asyncio.timeout(timeout_s):
                rewards = await generator.group_rewards(row, tuple(trajectories))
            if rewards is None:
                return tuple(trajectories)
            return with_group_rewards(trajectories, rewards)
        except MalformedRewardError as error:
            failures.record(row_id, GROUP_SCORING, error, FailureKind.HARNESS)
            log.warning("row %s: its group's rewards are malformed (counted, the row fails): %s", row_id, error)
            return None
        except Exception as error:  # the scorer's failure is the infrastructure's: again, then the row fails
            failures.record(row_id, GROUP_SCORING, error, FailureKind.INFRA)
            failures.infra_retries += attempt < retries
            fate = "scoring it again" if attempt < retries else "the row fails, nothing of it is trained"
            log.warning("row %s: scoring its group failed (%s of %d, counted, %s): %r", row_id, attempt + 1,
                        retries + 1, fate, error)
    return None
