"""The watchdog: a handle to an engine actor whose every call is bounded, and which fails at once, with an
`EngineDiedError` naming the engine and the last request it accepted, when the engine is declared dead. Each launched
engine is probed every `probe_interval_s`; an actor that is gone, an engine core that errored, or in-flight
requests with no token for `stall_timeout_s` while not paused mark it dead. A death is an event (`Mortal`): whoever
awaits `wait_dead` (the weight sync's supervisor) hears of it the moment it is declared."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from fullasync.contracts.engine import Mortal
from fullasync.engines.vllm.config import EngineHealth, VLLMEngineConfig
from fullasync.errors import EngineDiedError, InvalidRequestError, again

if TYPE_CHECKING:
    from fullasync.engines.vllm.actor import VLLMEngineActor

T = TypeVar("T")


class WatchedActor(Mortal):
    """A handle to one engine actor: bounded calls, and the watchdog that declares the engine dead."""

    def __init__(self, actor: ActorHandle[VLLMEngineActor], name: str, config: VLLMEngineConfig) -> None:
        self.actor = actor
        self.name = name
        self.config = config
        self.death: EngineDiedError | None = None
        self.calls: dict[str, int] = {}  # control calls made to the actor so far, by method (round trips)
        self._waiting: set[asyncio.Future[Any]] = set()  # calls to fail at once if the engine dies (any reply)
        self._watchdog: asyncio.Task[None] | None = None

    def watch(self) -> None:
        """Start probing the engine every `probe_interval_s` (idempotent)."""
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch(), name=f"watchdog-{self.name}")

    async def _watch(self) -> None:
        cfg = self.config
        while self.death is None:
            await asyncio.sleep(cfg.probe_interval_s)
            try:
                health: EngineHealth = await asyncio.wait_for(self.actor.health.remote(), cfg.stall_timeout_s)
            except RayActorError as error:
                self.mark_dead(f"its actor is gone ({type(error).__name__})", None)
            except (TimeoutError, GetTimeoutError):
                self.mark_dead(f"it did not answer a health probe within {cfg.stall_timeout_s:.0f} s", None)
            else:
                if health.core_errored:
                    self.mark_dead("its vLLM engine core has failed", health.last_request_id)
                elif health.seconds_without_progress > cfg.stall_timeout_s:
                    self.mark_dead(
                        f"{health.in_flight} in-flight request(s) made no progress for "
                        f"{health.seconds_without_progress:.0f} s (engine.stall_timeout_s={cfg.stall_timeout_s:g})",
                        health.last_request_id,
                    )

    def mark_dead(self, reason: str, last_request_id: str | None = None) -> None:
        """Declare the engine dead: waiting calls and every later call fail with an error naming it."""
        if self.death is not None:
            return
        last = f"; the last request it accepted was {last_request_id}" if last_request_id else ""
        self.death = EngineDiedError(f"engine {self.name} is dead: {reason}{last}")
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_exception(again(self.death))
        self._waiting.clear()

    async def _watched(self, awaitable: Awaitable[T], what: str, timeout_s: float, even_if_dead: bool = False) -> T:
        """Await a reply of the actor, but give up at once if the engine is declared dead meanwhile.

        A call abandoned (timeout, or the caller cancelled) is cancelled in the actor too, which
        aborts its vLLM request and frees the slot. `even_if_dead`: a restart talking to its new actor.
        """
        if self.death is not None and not even_if_dead:
            raise again(self.death)
        reply = asyncio.ensure_future(awaitable)
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        reply.add_done_callback(lambda done: _transfer(done, waiter))
        if not even_if_dead:
            self._waiting.add(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter
        except RayTaskError as error:
            if isinstance(error.cause, InvalidRequestError):
                raise error.cause from None
            raise
        except RayActorError as error:
            self.mark_dead(f"its actor died during {what} ({type(error).__name__})", None)
            raise EngineDiedError(f"engine {self.name} died during {what}: {error}") from error
        except (TimeoutError, GetTimeoutError) as error:
            raise TimeoutError(f"engine {self.name}: {what} took longer than {timeout_s:.0f} s") from error
        finally:
            self._waiting.discard(waiter)
            if not reply.done():
                reply.cancel()
                if isinstance(awaitable, ray.ObjectRef) and self.death is None:
                    ray.cancel(awaitable)

    async def _call(self, method: str, *args: object, timeout_s: float | None = None,
                    even_if_dead: bool = False) -> Any:
        """Call the actor's `method`; its reply (Any: Ray's actor methods are untyped, each caller states the type)."""
        timeout = self.config.call_timeout_s if timeout_s is None else timeout_s
        self.calls[method] = self.calls.get(method, 0) + 1
        return await self._watched(getattr(self.actor, method).remote(*args), method, timeout, even_if_dead)


def _transfer(source: asyncio.Future[T], target: asyncio.Future[T]) -> None:
    """Hand an actor's reply to the waiting caller (reading it even when nobody waits any more)."""
    if source.cancelled():
        if not target.done():
            target.cancel()
        return
    error = source.exception()
    if target.done():
        return
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())
