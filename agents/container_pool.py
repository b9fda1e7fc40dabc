"""Warm pools: the next episodes' containers started while the current ones run, and reused after a verified reset.

Owns: `WarmPool` — per (image, working directory) the containers started ahead, at most `size` of them ready or
starting in all. The rows about to start are announced (`ahead(key, count)`: the rollouter names the next row
while it waits for a place, so its group's containers start before its episodes do); the rest of the pool refills
behind the image taken last. An episode takes a ready container (started and checked as a fresh start would:
`Start` and the key's check) or, with none ready, starts its own. Warm containers take only places free now:
they never hold up an episode, and a start waiting for a place frees the longest-ready container. With `reuse`,
an episode's container goes back to its image's pool after a verified reset (`container_reset`), and a dirty one
is quarantined (removed, counted). `close` waits for what is starting or resetting and removes what is ready.
Does not own: how a container starts or what a place is (`fullasync_agents.containers`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fullasync.errors import InfraError
from fullasync_agents.container_reset import Baseline, baseline, reset

if TYPE_CHECKING:
    from fullasync_agents.containers import Container

POOL_EPISODE = "warm-pool"  # the episode label of a container started ahead
log = logging.getLogger(__name__)
Key = tuple[str, str]  # (image, working directory)
Check = Callable[["Container"], Awaitable[None]]  # raises InfraError: the container must not be used
# image, workdir, episode, wait for a place (False: None when no place is free now)
Start = Callable[[str, str, str, bool], Awaitable["Container | None"]]


async def checked(container: Container, check: Check | None) -> Container:
    """`container` once it passed `check`; removed (and the error raised) when it did not."""
    try:
        if check is not None:
            await check(container)
    except BaseException:
        await container.remove()
        raise
    return container


@dataclass
class WarmPool:
    size: int
    start_new: Start
    reuse: bool = False
    taken: int = 0  # episodes that got a ready container
    missed: int = 0  # episodes that found none ready and started their own
    reused: int = 0  # containers put back after a verified reset
    quarantined: int = 0  # resets found dirty: the container removed
    _ready: dict[Key, list[Container]] = field(default_factory=dict)
    _filling: Counter[Key] = field(default_factory=Counter)
    _announced: Counter[Key] = field(default_factory=Counter)  # takes announced and not yet taken
    _out: Counter[Key] = field(default_factory=Counter)  # with reuse: taken, to come back after their episodes
    _checks: dict[Key, Check] = field(default_factory=dict)
    _records: dict[str, Baseline] = field(default_factory=dict)  # container id -> its fresh state
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _last: Key | None = None
    _closed: bool = False

    def ahead(self, key: Key, count: int, check: Check | None = None) -> None:
        """`count` episodes of `key` are about to start: start their containers now."""
        self._note(key, check)
        self._announced[key] += count
        self.fill()

    async def take(self, key: Key, episode_id: str, check: Check | None = None) -> Container:
        """A ready container of `key`, or one started for `episode_id` now (waiting for a place)."""
        self._note(key, check)
        self._last = key
        if self._announced[key] > 0:
            self._announced[key] -= 1
        ready = self._ready.get(key, [])
        while ready:
            container = ready.pop(0)
            self.fill()
            if await container.alive():
                self.taken += 1
                self._out[key] += self.reuse
                return container
            await self._remove(container)
        self.missed += 1
        self._out[key] += self.reuse
        self.fill()
        try:
            started = await self.start_new(*key, episode_id, True)
            assert started is not None  # a start that waits for its place always gets one
            return await self._prepared(key, started)
        except BaseException:
            self._out[key] -= self.reuse
            raise

    def give_back(self, container: Container) -> bool:
        """After its episode: reset and reuse `container` (True), or False — the caller removes it."""
        key = (container.image, container.workdir)
        self._out[key] -= self.reuse
        record = self._records.get(container.id)
        if not self.reuse or self._closed or record is None:
            return False
        self._filling[key] += 1  # its place in the pool is taken while it resets
        self._spawn(self._recycle(key, container, record))
        return True

    def fill(self) -> None:
        """Start containers for the keys short of their target while the pool has room and places are free."""
        while not self._closed and (key := self._short()) is not None:
            self._filling[key] += 1
            self._spawn(self._start_ahead(key))

    def ready(self, key: Key) -> list[Container]:
        """The containers of `key` ready now, longest-ready first."""
        return list(self._ready.get(key, ()))

    async def free_one(self) -> bool:
        """Remove the longest-ready container (a waiting start needs its place); False when none is ready."""
        for ready in self._ready.values():
            if ready:
                await self._remove(ready.pop(0))
                return True
        return False

    async def close(self) -> None:
        self._closed = True
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        ready = [container for containers in self._ready.values() for container in containers]
        self._ready.clear()
        await asyncio.gather(*(self._remove(container) for container in ready), return_exceptions=True)

    # -- internals ---------------------------------------------------------------------------

    def _note(self, key: Key, check: Check | None) -> None:
        if check is not None:
            self._checks[key] = check
        self._ready.setdefault(key, [])

    def _short(self) -> Key | None:
        """The key whose containers to start next: announced ones first, then the last taken; None when full."""
        if self._held() >= self.size:
            return None

        def coming(key: Key) -> int:  # ready, starting, resetting, and (reuse) out with an episode
            return len(self._ready[key]) + self._filling[key] + self._out[key]
        for key, count in self._announced.items():
            if count > coming(key):
                return key
        last = self._last
        if last is not None and coming(last) < self.size - sum(self._announced.values()):
            return last
        return None

    def _held(self) -> int:
        """Containers ready, starting or resetting: what the pool's size bounds."""
        return sum(len(ready) for ready in self._ready.values()) + sum(self._filling.values())

    def _spawn(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_ahead(self, key: Key) -> None:
        try:
            started = await self.start_new(*key, POOL_EPISODE, False)
            container = None if started is None else await self._prepared(key, started)
        except InfraError as error:  # the episode that comes for it starts its own
            log.warning("a warm container of %s did not start: %s", key[0], error)
            container = None
        finally:
            self._filling[key] -= 1
        if container is None:
            return
        if await container.alive():  # asked here, off the take path: a take's ask is then a read of /proc
            await self._shelve(key, container)
        else:
            await self._remove(container)

    async def _prepared(self, key: Key, container: Container) -> Container:
        """A fresh container checked (and recorded, to be reset later); removed if that fails."""
        await checked(container, self._checks.get(key))
        if self.reuse:
            try:
                self._records[container.id] = await baseline(container)
            except BaseException:
                await container.remove()
                raise
        return container

    async def _recycle(self, key: Key, container: Container, record: Baseline) -> None:
        try:
            problems = await reset(container, record)
            if not problems and (check := self._checks.get(key)) is not None:
                await check(container)
        except (InfraError, ValueError) as error:
            problems = [str(error)]
        finally:
            self._filling[key] -= 1
        if problems:
            self.quarantined += 1
            log.warning("container %s of %s quarantined: its reset left %s", container.id[:12], key[0],
                        "; ".join(problems[:5]))
            await self._remove(container)
            return
        self.reused += 1
        await self._shelve(key, container)

    async def _shelve(self, key: Key, container: Container) -> None:
        if self._closed or self._held() >= self.size:
            await self._remove(container)
            return
        self._ready[key].append(container)

    async def _remove(self, container: Container) -> None:
        self._records.pop(container.id, None)
        await container.remove()
