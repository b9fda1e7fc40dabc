"""The harness contract beyond a plain function: `CustomGenerator`, for set-up/tear-down and out-of-process harnesses.

Owns: the base class, the per-episode context it receives, and `OpenEpisode`, the seam through which
the run gives an episode that context. A plain `async def rollout_fn(client, row)` needs none of this.
A `CustomGenerator` gets, per episode, an `EpisodeContext` with the in-process `RolloutClient` and —
when `uses_gateway` is True — the episode's OpenAI base URL and API key on the run's HTTP gateway, to
hand to a subprocess, container or CLI. (`fullasync.run` starts and stops that gateway and injects an
`OpenEpisode` over it into the rollouter; nothing here knows the gateway.) Every request through either
path is recorded into the same episode; `generate` returns a reward (the recorded calls become the
trajectory) or a whole `Trajectory`.

    class MyCLIHarness(CustomGenerator):
        uses_gateway = True

        async def generate(self, episode, row):
            done = await run_process("my-agent", "--base-url", episode.base_url, "--api-key", episode.api_key,
                                     row["task"])
            return 1.0 if done.returncode == 0 else 0.0

`run_process` runs a harness process in a process group of its own; when it is cancelled at
`rollout.episode_timeout_s` it is killed with every process below it (`processes.kill_tree`, which
also finds those that started sessions of their own), and when it ends whatever it left in its group
is killed, so nothing outlives its episode.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from fullasync.client import RolloutClient
from fullasync.client.beside import BesideClient
from fullasync.rollout.processes import kill_tree
from fullasync.types import Trajectory


@dataclass(frozen=True)
class EpisodeContext:
    """One episode as a generator sees it."""

    episode_id: str
    client: RolloutClient  # in-process, OpenAI-style
    base_url: str | None = None  # OpenAI base URL of this episode on the gateway (uses_gateway=True)
    api_key: str | None = None  # the key that goes with base_url
    # the gateway's one base URL for every episode of the run, each request naming its episode by the X-Session-ID
    # header (api_key): for a harness that keeps one HTTP client for the whole run (verifiers)
    run_base_url: str | None = None


OpenEpisode = Callable[[RolloutClient], AbstractContextManager[EpisodeContext]]
"""`with open_episode(client) as episode:` the context of `client`'s episode, valid until the block ends."""


class CustomGenerator:
    """Subclass and implement `generate`; `setup`/`teardown` run once around the whole run."""

    uses_gateway: bool = False  # True: the run starts the HTTP gateway, and each episode gets base_url/api_key

    async def setup(self) -> None:
        """Called once before the first episode (start a sandbox pool, load tools, ...)."""

    # `row: Any`: the user's dataset row, of the shape their own override declares (`row: dict[str, Any]`, ...);
    # fullasync passes it through untouched (as `object`) and never reads it
    async def generate(self, episode: EpisodeContext, row: Any) -> float | Trajectory:
        raise NotImplementedError(f"{type(self).__name__}.generate(episode, row) must be implemented")

    def coming(self, row: object, episodes: int) -> None:
        """`row` is next: its `episodes` start as soon as the run has room for them. Start what they will need now
        (build images, warm containers) in tasks of your own; a failure here must not raise (the episodes meet it
        again). Default: nothing."""

    async def teardown(self) -> None:
        """Called once after the last episode, also when the run fails."""

    async def group_rewards(self, row: object, trajectories: Sequence[Trajectory]) -> Sequence[float] | None:
        """The rewards of a row's episodes scored together (a group reward function, a judge ranking the answers),
        one per trajectory in episode order; called once every episode of the row has ended, before its group is
        queued. None (this default): each keeps the reward its episode returned. A raise or a timeout
        (`rollout.episode_timeout_s`) is an infrastructure failure: tried again up to `rollout.infra_retries`
        times, then the row fails (counted), never scored 0."""
        return None

    @property
    def scores_groups(self) -> bool:
        """True when a subclass scores whole groups (overrides `group_rewards`)."""
        return type(self).group_rewards is not CustomGenerator.group_rewards

    async def reward(self, client: RolloutClient, row: object, trajectory: Trajectory) -> float | None:
        """A training episode's reward given after it ended, in place of the one it returned (a judge scoring the
        answer: `client.judge`); within the episode's time. None (this default): the episode's own. A raise is the
        episode's failure as any other: a judge that did not answer (`BesideModelError`, `JudgeScoreError`) is the
        infrastructure's, the episode runs again, never scored 0. Held-out evaluation keeps the episode's own reward
        (or the run's `evaluate_fn`)."""
        return None


@dataclass(frozen=True)
class ProcessResult:
    pid: int
    returncode: int
    stdout: str
    stderr: str


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone
        return


async def run_process(*argv: str, cwd: str | None = None, env: Mapping[str, str] | None = None,
                      stdin: bytes | None = None) -> ProcessResult:
    """Run a harness process to its end in a process group of its own, then kill whatever is left of the group.

    Cancelling the call (the rollouter does at the episode timeout) kills the group at once: a harness
    that hangs, and every process it started, leave nothing behind. Output goes through files, not
    pipes, so a background process the harness left holding them cannot keep the episode waiting.
    """
    with tempfile.TemporaryFile() as given, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        given.write(stdin or b"")
        given.seek(0)
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=dict(env) if env is not None else None, start_new_session=True,
            stdin=given, stdout=out, stderr=err,
        )
        try:
            returncode = await process.wait()
        finally:
            if process.returncode is None:  # cancelled: the harness and all below it, own sessions included
                kill_tree(process.pid)
            _kill_group(process.pid)  # what it left behind in its group
            if process.returncode is None:
                await process.wait()
        out.seek(0)
        err.seek(0)
        return ProcessResult(process.pid, returncode, out.read().decode(errors="replace"),
                             err.read().decode(errors="replace"))


RolloutFunction = Callable[[RolloutClient, Any], Awaitable["float | Trajectory"]]  # async def rollout_fn(client, row)
RolloutFn = RolloutFunction | CustomGenerator
# async def group_reward_fn(row, trajectories) -> one reward per trajectory, in order
GroupRewardFunction = Callable[[object, Sequence[Trajectory]], Awaitable[Sequence[float]]]
# async def reward_fn(judge, row, trajectory) -> the episode's reward (judge: the run's model of role judge)
RewardFunction = Callable[[BesideClient, object, Trajectory], Awaitable[float]]


class FunctionGenerator(CustomGenerator):
    """A plain `async def rollout_fn(client, row)` as a generator (`as_generator`): no set-up, no gateway; with
    `group_reward_fn`, its rows' groups are scored by it (`CustomGenerator.group_rewards`)."""

    def __init__(self, rollout_fn: RolloutFunction, group_reward_fn: GroupRewardFunction | None = None,
                 reward_fn: RewardFunction | None = None) -> None:
        self.rollout_fn = rollout_fn
        self.group_reward_fn = group_reward_fn
        self.reward_fn = reward_fn

    async def generate(self, episode: EpisodeContext, row: object) -> float | Trajectory:
        return await self.rollout_fn(episode.client, row)

    async def group_rewards(self, row: object, trajectories: Sequence[Trajectory]) -> Sequence[float] | None:
        return None if self.group_reward_fn is None else await self.group_reward_fn(row, trajectories)

    @property
    def scores_groups(self) -> bool:
        return self.group_reward_fn is not None

    async def reward(self, client: RolloutClient, row: object, trajectory: Trajectory) -> float | None:
        return None if self.reward_fn is None else await self.reward_fn(client.judge, row, trajectory)


def _is_async(function: object) -> bool:
    return inspect.iscoroutinefunction(function) or callable(function) and inspect.iscoroutinefunction(
        type(function).__call__)


HOOKS = {  # a reward function's argument: its signature, and the CustomGenerator method that takes its place
    "group_reward_fn": ("async def group_reward_fn(row, trajectories)",
                        "group_rewards", "async def group_rewards(self, row, trajectories)"),
    "reward_fn": ("async def reward_fn(judge, row, trajectory)",
                  "reward", "async def reward(self, client, row, trajectory)"),
}


def as_generator(rollout_fn: RolloutFn, group_reward_fn: GroupRewardFunction | None = None,
                 reward_fn: RewardFunction | None = None) -> CustomGenerator:
    """The user's harness as a `CustomGenerator` (a plain function wrapped once, where a run or an evaluation is
    assembled, with `group_reward_fn` and `reward_fn` if given); refuses at once what would fail every episode
    later."""
    given = {"group_reward_fn": group_reward_fn, "reward_fn": reward_fn}
    for name, function in given.items():
        if function is not None and not _is_async(function):
            raise TypeError(f"{name} {function!r} is not an async function: define it as `{HOOKS[name][0]}`")
    if isinstance(rollout_fn, CustomGenerator):
        if not inspect.iscoroutinefunction(rollout_fn.generate):
            raise TypeError(f"{type(rollout_fn).__name__}.generate must be `async def generate(self, episode, row)`")
        for name, function in given.items():
            _, method, signature = HOOKS[name]
            if function is not None:
                raise TypeError(f"{name} with a CustomGenerator ({type(rollout_fn).__name__}): override its "
                                f"`{signature}` instead")
            overridden = getattr(type(rollout_fn), method) is not getattr(CustomGenerator, method)
            if overridden and not inspect.iscoroutinefunction(getattr(rollout_fn, method)):
                raise TypeError(f"{type(rollout_fn).__name__}.{method} must be `{signature}`")
        return rollout_fn
    if _is_async(rollout_fn):
        return FunctionGenerator(rollout_fn, group_reward_fn, reward_fn)
    raise TypeError(
        f"rollout_fn {rollout_fn!r} is not an async function: define it as `async def rollout_fn(client, row)` "
        "and `await` the client's calls (or pass a fullasync.CustomGenerator)"
    )


async def run_harness(generator: CustomGenerator, episode_context: OpenEpisode | None, client: RolloutClient,
                      row: object) -> float | Trajectory:
    """One episode of the harness on `client`, with the episode's context: `episode_context(client)` when the run
    opens episodes on a gateway, else the client only."""
    if episode_context is None:
        return await generator.generate(EpisodeContext(client.episode.id, client), row)
    with episode_context(client) as episode:
        return await generator.generate(episode, row)
