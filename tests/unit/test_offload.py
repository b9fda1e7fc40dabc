"""`fullasync.infra.offload`: the pacer that spreads bursts over the loop's clock, and piecewise release. No timing is
asserted: the pacer runs on the simulator's virtual clock, where its windows are exact."""

from __future__ import annotations

import asyncio

import pytest

from fullasync.infra.offload import Pacer, drop_piecewise
from fullasync.sim.clock import run_virtual


def test_a_pacer_lets_a_burst_start_per_window_and_carries_the_excess_over():
    async def main() -> list[float]:
        pacer = Pacer(burst=32, rest_s=0.015)
        return [pacer.delay(8) for _ in range(9)]  # rows of 8 episodes asked at one instant

    # four rows fill the first window (now), four the next (+15 ms), the ninth opens the third
    assert run_virtual(main) == pytest.approx([0.0] * 4 + [0.015] * 4 + [0.030])


def test_units_past_a_full_window_move_to_the_next_and_an_idle_pacer_starts_afresh():
    async def main() -> tuple[list[float], float]:
        pacer = Pacer(burst=4, rest_s=0.01)
        delays = [pacer.delay(3), pacer.delay(3), pacer.delay(1), pacer.delay(1)]
        await asyncio.sleep(1.0)  # long after every window: the next burst starts at once
        return delays, pacer.delay(4)

    delays, after_idle = run_virtual(main)
    # 3 of 4 used; 6 of 4 (the 2 over carry into the next window); that window holds 2 + 1 = 3, then 4
    assert delays == pytest.approx([0.0, 0.0, 0.01, 0.01]) and after_idle == 0.0


def test_tasks_that_wait_their_turn_start_window_by_window():
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        pacer = Pacer(burst=2, rest_s=0.5)
        started: list[float] = []

        async def one() -> None:
            await pacer.turn()
            started.append(loop.time())

        await asyncio.gather(*(one() for _ in range(5)))
        return started

    assert run_virtual(main) == pytest.approx([0.0, 0.0, 0.5, 0.5, 1.0])


@pytest.mark.parametrize("burst, rest_s", [(0, 0.01), (4, 0.0)])
def test_a_pacer_rejects_what_cannot_pace(burst, rest_s):
    with pytest.raises(ValueError, match="burst >= 1 and rest_s > 0"):
        Pacer(burst, rest_s)


def test_drop_piecewise_empties_every_list_it_is_given():
    first, second = [object() for _ in range(5)], [[1, 2], [3]]
    drop_piecewise(first, second)
    assert first == [] and second == []
