"""Pushes new weights into running engines: pause → push → bump version → resume; keeps them there.

Owns: which engines get which version, and the push's timing. A push is one transaction of its `WeightTransport`
(`start_weight_update` → `update_weights` per engine → `finish_weight_update`); with the default
`ObjectStoreTransport` each engine runs pause → update → resume itself in one call (`Engine.install`, one round trip
per engine per push); engines install concurrently (an ABORT push starts them paced by the requests each interrupts,
which all come back to the driver) and each resumes as soon as it holds the new weights, checked by checksums of a
sample of the pushed tensors against what it serves (`weights/digests.py`). An engine never serves from a failed
load: it stays paused until a retry succeeds or it restarts. The version is published only when every live engine
holds it: an engine whose install fails twice is declared dead and restarts from scratch with the new version (or,
without restarts, the push fails naming it) — never torn weights. It also keeps every engine at the current version:
with `restart_on_failure`, `supervise()` (a task the run starts) restarts an engine the moment the watchdog declares
it dead (`Engine.wait_dead`, an event) and installs the current weights on it (without, it fails the run naming the
engine; `wait_failed()` returns what ended it, as soon as it happens); an engine that dies during a push is skipped
and gets the new weights at its restart — what the transport makes of them (`materialize`: a streamed push's weights
are gathered from the trainer while it still holds them, taken right after the push when an engine is dead then, and
otherwise the restart waits for the next push). Push and restart never interleave (one lock). Components that follow
the version (the rollouter's admission) observe it: `observe(callback)`, called with each version as it is
published. Does not own: how the trainer exports weights, how they travel (`weights/transport.py`), or how an engine
notices it died (its watchdog).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from fullasync.contracts.engine import Engine, InstallTiming, PauseMode
from fullasync.contracts.weights import StreamedWeights, WeightsMovedOn, WeightsPayload, WeightTransport
from fullasync.errors import EngineDiedError, WeightPushError, again
from fullasync.infra.offload import Pacer, first_of
from fullasync.weights.transport import ObjectStoreTransport

log = logging.getLogger("fullasync")

INSTALL_ATTEMPTS = 2  # a failed install is tried once more before its engine is replaced (or the push fails)
RESTART_ATTEMPTS = 3  # restarts of a dead engine that fail in a row (it died again while starting) before the run does
# An ABORT push returns every interrupted generation to the driver, which takes it in and, once its engine resumes,
# sends it again: thousands at one instant stall the loop at the pause and again at the resume (bench/control_plane.py;
# the figures: docs/benchmarks/figures.md). Engines start their install at most this many interrupted requests
# per window (an engine with more takes the windows it needs), so both bursts are spread.
ABORT_BURST_REQUESTS = 64
ABORT_REST_S = 0.010


@dataclass(frozen=True)
class WeightPushTiming:
    """Seconds spent in each phase of one push (the slowest engine's), and the version it installed."""

    version: int
    pause_s: float
    update_s: float
    resume_s: float
    wall_s: float = 0.0  # the whole push as the caller waited for it (round trip included)
    phases: dict[str, float] = field(default_factory=dict)  # finer phases of update_s (slowest engine's)
    starved: int = 0  # requests it interrupted before a token since the push before (every engine's)
    starved_wait_s: float = 0.0  # how long an engine's pause waited for starved requests (the longest; in pause_s)

    @property
    def total_s(self) -> float:
        return self.pause_s + self.update_s + self.resume_s


class WeightSync:
    """Installs successive weight versions on a fixed set of engines."""

    def __init__(self, engines: Sequence[Engine], mode: PauseMode = PauseMode.ABORT, version: int = 0,
                 restart_on_failure: bool = False, transport: WeightTransport | None = None,
                 in_flight: Callable[[str], int] | None = None) -> None:
        if not engines:
            raise ValueError("WeightSync needs at least one engine")
        self.engines = list(engines)
        self.mode = PauseMode(mode)
        self.version = version
        self.start_version = version  # the version this run started from (a resumed run keeps its first run's)
        self.restart_on_failure = restart_on_failure
        self.restarts = 0  # engines restarted so far
        self.failed_installs = 0  # engines declared dead because they could not install a push
        self.transport: WeightTransport = transport if transport is not None else ObjectStoreTransport()
        self.in_flight = in_flight  # requests running on an engine, by name: paces the installs of an ABORT push
        # the weights of `version` (None: the engines' own initial weights)
        self._latest: WeightsPayload | StreamedWeights | None = None
        self._lock = asyncio.Lock()
        self._observers: list[Callable[[int], None]] = []
        self._failure: BaseException | None = None  # what ends the run: a failed restart, or a death without restarts
        self._failed = asyncio.Event()
        self._pushed = asyncio.Event()  # set at each published version (a restart waiting for weights hears of it)

    def observe(self, on_version: Callable[[int], None]) -> None:
        """Call `on_version(version)` each time a version is published (every live engine holds it)."""
        self._observers.append(on_version)

    def check_engines(self) -> None:
        """Raise what ends the run: a failed restart, or a dead engine when restarts are off."""
        if self._failure is not None:
            raise self._failure
        if not self.restart_on_failure:
            for engine in self.engines:
                if engine.death is not None:
                    raise again(engine.death)

    async def wait_failed(self) -> BaseException:
        """Return what ends the run as soon as `supervise` finds it (the run awaits this beside the training loop)."""
        await self._failed.wait()
        assert self._failure is not None
        return self._failure

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        self._failed.set()

    async def push(self, weights: WeightsPayload | StreamedWeights) -> WeightPushTiming:
        """Install `weights` (a name→tensor mapping, a Ray ref to one, or what the trainer streams) as version + 1."""
        return await self._install(weights, None)

    async def restore(self, weights: WeightsPayload | StreamedWeights, version: int,
                      start_version: int) -> WeightPushTiming:
        """Resume a run: install its checkpoint's weights as `version` (numbering goes on from there)."""
        timing = await self._install(weights, version)
        self.start_version = start_version
        return timing

    async def _install(self, weights: WeightsPayload | StreamedWeights, version: int | None) -> WeightPushTiming:
        self.check_engines()
        async with self._lock:
            new_version = self.version + 1 if version is None else version
            clock = asyncio.get_running_loop().time  # the loop's clock: real, or simulated (fullasync.sim)
            live = [e for e in self.engines if e.death is None]
            start = clock()
            await self.transport.start_weight_update(weights, new_version, live)
            turn = self._abort_turns()
            timings = await self._on_each(live, lambda e: self._install_on(e, new_version, turn))
            await self.transport.finish_weight_update(new_version)
            self.version, self._latest = new_version, weights  # published: every live engine holds it
            for on_version in self._observers:
                on_version(new_version)
            self._pushed.set()
            if self.restart_on_failure and any(e.death is not None for e in self.engines):
                # what the dead engines restart with, taken now: a streamed push's trainer holds it only until
                # its next step
                self._latest = await self.transport.materialize(weights)
            wall = clock() - start
        slowest = max(timings, key=lambda t: t.pause_s + t.update_s + t.resume_s,
                      default=InstallTiming(0.0, 0.0, 0.0))
        return WeightPushTiming(new_version, max((t.pause_s for t in timings), default=0.0),
                                max((t.update_s for t in timings), default=0.0),
                                max((t.resume_s for t in timings), default=0.0), wall, dict(slowest.phases),
                                sum(t.starved for t in timings), max((t.starved_wait_s for t in timings), default=0.0))

    def _abort_turns(self) -> Callable[[Engine], Awaitable[None]] | None:
        """For an ABORT push with in-flight counts: waits for each engine's turn, one pacer unit per request it
        interrupts (`ABORT_BURST_REQUESTS`); None: every engine starts at once."""
        in_flight = self.in_flight
        if self.mode is not PauseMode.ABORT or in_flight is None:
            return None
        pacer = Pacer(ABORT_BURST_REQUESTS, ABORT_REST_S)
        return lambda engine: pacer.turn(max(1, in_flight(engine.name)))

    async def _install_on(self, engine: Engine, version: int,
                          turn: Callable[[Engine], Awaitable[None]] | None = None) -> InstallTiming | None:
        """Install the started push on `engine`, after its `turn` when given. A failure other than its death (a
        transfer that broke off, tensors served otherwise than pushed) is tried once more — the engine stays paused
        in between, serving nothing loaded in part; failing again, the engine is declared dead so that it restarts
        from scratch with this version (`restart_on_failure`), or the push fails naming it. None: the engine is left
        to its restart."""
        if turn is not None:
            await turn(engine)
        for attempt in range(1, INSTALL_ATTEMPTS + 1):
            try:
                return await self.transport.update_weights(engine, version, self.mode)
            except EngineDiedError:
                if not self.restart_on_failure:
                    raise
                log.warning("engine %s died during a weight push; it gets version %d when restarted",
                            engine.name, version)
                return None
            except Exception as error:  # the install is retried, or the engine replaced, or the push fails here
                if attempt < INSTALL_ATTEMPTS:
                    log.warning("engine %s could not install weight version %d (%r): trying again", engine.name,
                                version, error)
                    continue
                if not self.restart_on_failure:
                    raise WeightPushError(f"engine {engine.name} could not install weight version {version} in "
                                          f"{INSTALL_ATTEMPTS} attempts (last: {error!r}); it is left paused and the "
                                          "run stops (engine.restart_on_failure=true restarts such an engine "
                                          "instead)") from error
                self.failed_installs += 1
                engine.mark_dead(f"it could not install weight version {version} in {INSTALL_ATTEMPTS} attempts "
                                 f"(last: {error!r})")
                log.warning("engine %s could not install weight version %d: declared dead, it restarts serving "
                            "that version", engine.name, version)
                return None
        raise AssertionError("unreachable: every attempt returns or raises")

    async def _on_each(self, engines: list[Engine],
                       step: Callable[[Engine], Awaitable[InstallTiming | None]]) -> list[InstallTiming]:
        """Run `step` on every engine at once; the timings of those that installed."""
        outcomes = await asyncio.gather(*(step(e) for e in engines), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [outcome for outcome in outcomes if isinstance(outcome, InstallTiming)]

    async def restart_dead(self) -> list[str]:
        """Restart every engine declared dead, serving the current version; the names restarted."""
        async with self._lock:
            restarted: list[str] = []
            dead = [engine for engine in self.engines if engine.death is not None]
            if not dead:
                return restarted
            try:
                latest = None if self._latest is None else await self.transport.materialize(self._latest)
            except WeightsMovedOn as error:  # the push after the trainer's step takes them for the restart
                log.warning("engines %s wait for the next push to restart: %s", [e.name for e in dead], error)
                return restarted
            self._latest = latest
            for engine in dead:
                log.warning("restarting %s (%s)", engine.name, engine.death)
                await engine.restart(latest, self.version)
                self.restarts += 1
                restarted.append(engine.name)
            return restarted

    async def supervise(self, retry_s: float) -> None:
        """Run as a task: restart dead engines as they are declared dead (`Engine.wait_dead`: no poll between a death
        and its restart; `restart_on_failure`); a restart that fails is tried again after `retry_s`, up to
        `RESTART_ATTEMPTS` in a row; engines whose weights moved on wait for the next push. Then that failure, or a
        death without restarts, is kept for `wait_failed` and `check_engines`, and the task ends."""
        failed_in_a_row = 0
        while True:
            dead = [e.death for e in self.engines if e.death is not None]
            if not dead:
                await first_of(engine.wait_dead() for engine in self.engines)
                continue
            if not self.restart_on_failure:
                self._fail(dead[0])
                return
            self._pushed.clear()  # a push from here on brings the weights a restart may have waited for
            try:
                restarted = await self.restart_dead()
                failed_in_a_row = 0
            except Exception as error:  # kept: the run raises it as its error
                failed_in_a_row += 1
                if failed_in_a_row < RESTART_ATTEMPTS and isinstance(error, EngineDiedError):
                    log.warning("an engine restart failed (%d of %d in a row), trying again in %.0f s: %s",
                                failed_in_a_row, RESTART_ATTEMPTS, retry_s, error)
                    await asyncio.sleep(retry_s)
                    continue
                failure = EngineDiedError(f"an engine could not be restarted: {error!r}")
                failure.__cause__ = error
                self._fail(failure)
                return
            if not restarted and any(e.death is not None for e in self.engines):
                await self._pushed.wait()  # the weights to restart with moved on (`restart_dead`): the next push

