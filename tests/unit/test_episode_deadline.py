"""An episode's deadline stops while a call waits for a dead engine's restart (fullasync.rollout.deadline), and a
wait that outlives its episode (a gateway request still waiting when the episode ended) leaves it alone."""

from __future__ import annotations

import asyncio

from fullasync.rollout.deadline import EpisodeDeadline
from fullasync.sim.clock import run_virtual


def test_time_waiting_for_a_restart_does_not_count_against_the_episode():
    async def main():
        async with asyncio.timeout(2.0) as timeout:
            deadline = EpisodeDeadline(timeout)
            with deadline.scope():
                with deadline.suspended():
                    await asyncio.sleep(5.0)  # an engine restart: longer than the whole deadline
                await asyncio.sleep(1.5)  # the time left still runs
        return True

    assert run_virtual(main)


def test_a_wait_that_outlives_its_episode_ends_without_touching_the_finished_deadline():
    async def main():
        restarted = asyncio.Event()
        waits: list[BaseException | None] = []

        async def request(deadline: EpisodeDeadline) -> None:  # runs in a task of its own, as a gateway request
            try:
                with deadline.suspended():
                    await restarted.wait()
                waits.append(None)
            except BaseException as error:
                waits.append(error)

        async with asyncio.timeout(10.0) as timeout:
            deadline = EpisodeDeadline(timeout)
            with deadline.scope():
                waiting = asyncio.ensure_future(request(deadline))
                await asyncio.sleep(1.0)  # the episode ends while its request waits for the engine
        restarted.set()
        await waiting
        later = asyncio.ensure_future(request(deadline))  # and one that starts waiting after it ended
        await later
        return waits

    assert run_virtual(main) == [None, None]
