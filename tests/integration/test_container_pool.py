"""Warm pools (podman, `make setup-containers`): containers started ahead are taken by the episodes that come, a
start waiting for a place frees a ready one, and with `reuse` a container serves the next episode only after a
verified reset — nothing of the episode left (repository, /tmp, $HOME, processes) — a dirty one is quarantined."""

from __future__ import annotations

import asyncio
import os

import pytest
from agents_common import our_containers, podman_required  # noqa: F401

from fullasync_agents.containers import Container, Containers, ContainerSettings
from fullasync_agents.swe_tasks.history import HistoryGuard

pytestmark = pytest.mark.usefixtures("podman_required")
ROW = {"id": "pool",
       "image_recipe": {"files": {"calc.py": "def add(a, b):\n    return a - b\n", ".gitignore": "*.log\n"}}}
# What an episode leaves that the next one must never see: its fix (on a branch, committed, stashed), files in the
# repository and outside it, shell history, a process still running.
EPISODE = """
printf 'def add(a, b):\\n    return a + b\\n' > calc.py && git stash -q && git stash apply -q
git checkout -qb fix && git -c user.name=a -c user.email=a@b commit -qam fix && git tag solved
echo answer > notes.txt && echo answer > run.log && mkdir -p build && echo answer > build/out
echo answer > /tmp/answer && echo answer > /var/tmp/answer && echo 'cat /tmp/answer' >> ~/.bash_history
mkdir -p ~/.cache/agent && echo answer > ~/.cache/agent/memo && git config user.name answer
setsid nohup sleep 1234 > /dev/null 2>&1 &
"""


async def _wait(condition, what: str, timeout_s: float = 120.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s")


async def _sh(container: Container, command: str) -> str:
    done = await container.exec(command, 60.0)
    assert done.returncode == 0, done.output
    return done.output


async def test_containers_started_ahead_are_taken_and_close_removes_the_rest():
    containers = Containers(ContainerSettings(warm_pool=3))
    await containers.sweep()  # what a killed run left goes first
    before = our_containers()
    image = await containers.image_for(ROW)
    pool = containers.pool
    assert pool is not None
    containers.ahead(image, "/testbed", 2)  # the next row's two episodes
    await _wait(lambda: len(pool.ready((image, "/testbed"))) == 2, "two containers ready")
    ready = {container.id for container in pool.ready((image, "/testbed"))}
    first = await containers.start(image, "/testbed", "pool-1")
    second = await containers.start(image, "/testbed", "pool-2")
    assert {first.id, second.id} == ready and (pool.taken, pool.missed) == (2, 0)
    assert "return a - b" in await _sh(first, "cat calc.py")
    # the image taken last refills behind them: the pool holds its size
    await _wait(lambda: len(pool.ready((image, "/testbed"))) == 3, "the pool refilled")
    other = await containers.start(image, "/srv", "pool-3")  # nothing ready for this working directory
    assert pool.missed == 1 and other.id not in ready
    for container in (first, second, other):
        await containers.finish(container)  # no reuse: removed
    await containers.close()
    assert our_containers() == before


async def test_a_start_waiting_for_a_place_frees_a_ready_container():
    containers = Containers(ContainerSettings(max_running=1, warm_pool=1))
    await containers.sweep()  # what a killed run left goes first
    before = our_containers()
    image = await containers.image_for(ROW)
    pool = containers.pool
    assert pool is not None
    containers.ahead(image, "/testbed", 1)
    await _wait(lambda: len(pool.ready((image, "/testbed"))) == 1, "a container ready")
    warm = pool.ready((image, "/testbed"))[0].id
    started = await asyncio.wait_for(containers.start(image, "/", "pool-elsewhere"), 120.0)
    assert started.id != warm and warm not in our_containers() and pool.missed == 1
    await containers.finish(started)
    await containers.close()
    assert our_containers() == before


async def test_a_reused_container_holds_nothing_of_the_episode_before():
    containers = Containers(ContainerSettings(warm_pool=2, reuse=True))
    await containers.sweep()  # what a killed run left goes first
    before = our_containers()
    guard = HistoryGuard(containers)
    image = await containers.image_for(ROW)
    pool = containers.pool
    assert pool is not None
    first, task = await guard.start({"workdir": "/testbed"}, image, "reuse-1")
    fresh = await _sh(first, "ls -A /tmp /var/tmp ~; git status --porcelain --ignored; git log --all --oneline")
    await _sh(first, EPISODE)
    assert "1234" in await _sh(first, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    await containers.finish(first)
    await _wait(lambda: pool.reused + pool.quarantined == 1, "the reset")
    # the pool holds the reset container beside the fresh one that refilled it behind the first take
    await _wait(lambda: len(pool.ready((first.image, "/testbed"))) == 2, "both ready")  # the cut image's pool
    taken = [(await guard.start({"workdir": "/testbed"}, image, f"reuse-{i}"))[0] for i in (2, 3)]
    assert first.id in {container.id for container in taken} and (pool.taken, pool.quarantined) == (2, 0)
    second = next(container for container in taken if container.id == first.id)
    await containers.finish(next(container for container in taken if container is not second))
    seen = await _sh(second, "ls -A /tmp /var/tmp ~; git status --porcelain --ignored; git log --all --oneline")
    assert seen == fresh and "answer" not in seen
    assert "return a - b" in await _sh(second, "cat calc.py")
    refs = "git stash list; git tag; git branch --format='%(refname)'; git config user.name || true"
    assert (await _sh(second, refs)).split() == ["refs/heads/master"]  # the cut's one ref
    assert await _sh(second, "git rev-parse HEAD") == task["base_commit"] + "\n"
    assert "1234" not in await _sh(second, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    await containers.finish(second)
    await _wait(lambda: pool.reused + pool.quarantined == 3, "the other resets")
    assert pool.quarantined == 0
    await containers.close()
    assert our_containers() == before


@pytest.mark.parametrize("damage", [
    "echo changed >> /etc/debian_version",  # a file of the image changed outside the repository
    "rm /etc/issue",  # one deleted
    # one of its stored objects
    "f=$(find .git/objects/??/ -type f | head -1) && chmod u+w $f && printf x | dd of=$f bs=1 seek=9 conv=notrunc",
])
async def test_a_dirty_reset_quarantines_the_container(damage):
    containers = Containers(ContainerSettings(warm_pool=1, reuse=True))
    await containers.sweep()  # what a killed run left goes first
    before = our_containers()
    image = await containers.image_for(ROW)
    pool = containers.pool
    assert pool is not None
    first = await containers.start(image, "/testbed", "dirty-1")
    await _sh(first, damage)
    await containers.finish(first)
    await _wait(lambda: pool.reused + pool.quarantined == 1, "the reset")
    assert pool.quarantined == 1
    assert pool.reused == 0 and first.id not in our_containers()
    second = await containers.start(image, "/testbed", "dirty-2")
    assert second.id != first.id
    await containers.finish(second)
    await containers.close()
    assert our_containers() == before


async def test_a_containers_liveness_after_its_first_inspect_reads_proc_and_sees_it_die():
    containers = Containers()
    image = await containers.image_for(ROW)
    container = await containers.start(image, "/testbed", "pool-alive")
    try:
        assert await container.alive() and container._init is not None  # the inspect recorded its init's pid
        pid, _ = container._init
        assert await container.alive()  # from /proc now
        killed = await container.cli("kill")
        assert killed.returncode == 0, killed.output
        await _wait(lambda: not os.path.exists(f"/proc/{pid}"), "the container's init to exit", 30)
        assert not await container.alive()
    finally:
        await containers.finish(container)
