"""The engine actor's weight installs: pause → load → label → check → resume in one call, from buckets in shared
memory (the object-store transport) or from a broadcast of the trainer's ranks (the streamed one), through vLLM's
weight-transfer API; after each, a sample of tensors is compared with what every worker holds
(`WeightInstallError` names those that differ, and the version label is taken back).

`WeightInstall` is the half of `VLLMEngineActor` that does this; the other half (`actor.py`) generates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fullasync.contracts.engine import InstallTiming, PauseMode
from fullasync.contracts.weights import NamedTensors
from fullasync.engines.vllm.config import VLLMEngineConfig
from fullasync.errors import WeightInstallError
from fullasync.weights.digests import Served, mismatches, received_mismatches, sampled_names, served_digests
from fullasync.weights.shm import WeightSender
from fullasync.weights.stream import StreamPlan

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


@dataclasses.dataclass
class InFlight:
    """One call's request while vLLM runs it."""

    request_id: str
    starved: int = 0  # pushes in a row that interrupted it (and the requests it continues) before it had a token
    tokens: int = 0  # received so far
    tokens_at_push: int = 0  # received when the last push interrupted it (a "recompute" push: it goes on after)
    in_engine: bool = False  # handed to vLLM (not held for the end of a push)
    ended: bool = False
    recomputed: list[int] = dataclasses.field(default_factory=list)  # versions of "recompute" pushes while it ran

    @property
    def waiting_for_token(self) -> bool:
        """No token since its admission or the last push that interrupted it."""
        return self.tokens == self.tokens_at_push


class WeightInstall:
    """The weight-install half of `VLLMEngineActor` (its state is set up by the actor's `__init__`)."""

    config: VLLMEngineConfig
    name: str
    _version: int
    _resumed: asyncio.Event
    _pause_mode: PauseMode
    _in_flight: dict[int, InFlight]
    _tied_embeddings: bool
    _weights: WeightSender
    _last_pause: tuple[int, float]  # of the last pause: requests it interrupted starved, seconds it waited for some

    def _started(self) -> AsyncLLM:
        raise NotImplementedError

    async def pause(self, mode: PauseMode) -> None:
        raise NotImplementedError

    async def resume(self) -> None:
        raise NotImplementedError

    async def install(self, named_tensors: NamedTensors, version: int, mode: PauseMode) -> InstallTiming:
        """pause → update_weights → resume in one call: one round trip per push. An update that fails leaves the
        engine paused — it serves nothing from weights loaded in part — until an install succeeds or it restarts.

        `named_tensors` is the mapping itself: Ray resolves the object reference `RayEngine.install` passes."""
        clock = time.perf_counter
        start = clock()
        await self.pause(mode)
        paused = clock()
        phases = await self.update_weights(named_tensors, version)
        updated = clock()
        await self.resume()
        starved, waited = self._last_pause
        return InstallTiming(paused - start, updated - paused, clock() - updated, phases, starved, waited)

    async def update_weights(self, named_tensors: NamedTensors | StreamPlan, version: int) -> dict[str, float]:
        """Reload weights in place and label what follows with `version`; the engine must be paused.

        Through vLLM's weight-transfer API with the shared-memory backend (`weights/vllm.py`):
        `start_weight_update` → `update_weights`, during which each worker reads bucket i while this actor fills
        bucket i + 1 (`weights/shm.py`) → `finish_weight_update(version)`, after which the engine reports
        `version` itself (`served_version`); then the checksums of a sample are compared.
        Returns seconds per phase: copy_s (filling buckets), load_s (until vLLM reloaded the last),
        reset_s (prefix cache and version label), and the hand-off file's size (shm_bytes).
        """
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if self._resumed.is_set():
            raise RuntimeError(f"engine {self.name}: pause the engine before update_weights (see WeightSync)")
        if isinstance(named_tensors, StreamPlan):
            return await self._receive_stream(named_tensors, version)
        tensors = dict(named_tensors)
        if self._tied_embeddings and "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
            # vLLM's CPU output layer keeps its own packed copy of tied embeddings; it is
            # refreshed only when lm_head.weight is among the loaded weights.
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        llm = self._started()
        started = time.perf_counter()
        timeout = self.config.call_timeout_s
        layout, buckets = self._weights.prepare(tensors, timeout, readers=self.config.tensor_parallel_size)
        received = threading.Event()
        await llm.start_weight_update()
        request = WeightTransferUpdateRequest({"layout": layout.as_dict()})
        update = asyncio.ensure_future(llm.update_weights(request))
        update.add_done_callback(lambda _: received.set())
        try:
            copy_s = await asyncio.to_thread(self._weights.send, buckets, received, timeout)
        except BaseException:
            self._weights.abandon()
            await asyncio.gather(update, return_exceptions=True)
            raise
        await update
        phases = await self._serve(version, started, lambda: self._check_served(tensors, version))
        return {"copy_s": copy_s, **phases, "buckets": float(len(buckets)),
                "shm_bytes": float(self._weights.file_bytes)}

    async def _serve(self, version: int, started: float, check: Callable[[], Awaitable[int]]) -> dict[str, float]:
        """After the last tensor is loaded: label what the engine serves with `version` (vLLM's own label too),
        `check` it (how many tensors compared; it raises on a mismatch, and the label is taken back), drop the
        prefix cache. Returns load_s (since `started`), verify_s, reset_s and checked_tensors."""
        llm = self._started()
        await llm.finish_weight_update(str(version))  # the engine now labels what it serves with `version`
        loaded = time.perf_counter()
        try:
            checked = await check()
        except BaseException:
            await llm.update_weight_version(str(self._version))  # it does not serve `version`: take the label back
            raise
        verified = time.perf_counter()
        await llm.reset_prefix_cache()
        self._version = version
        if self._pause_mode is PauseMode.RECOMPUTE:  # what is in flight prefills again under `version`
            for running in self._in_flight.values():
                running.recomputed.append(version)
        return {"load_s": loaded - started, "verify_s": verified - loaded, "reset_s": time.perf_counter() - verified,
                "checked_tensors": float(checked)}

    async def _receive_stream(self, plan: StreamPlan, version: int) -> dict[str, float]:
        """`update_weights` of a streamed push: every worker takes the buckets the trainer's rank 0 broadcasts
        (`weights/stream.py`) and loads them; then the sampled tensors, checked on arrival against the sender's
        digests, are compared with what each worker's model holds."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        llm = self._started()
        started = time.perf_counter()
        await llm.start_weight_update()
        await llm.update_weights(WeightTransferUpdateRequest({"stream": plan.as_dict()}))
        phases = await self._serve(version, started, lambda: self._check_received(version))
        return {**phases, "buckets": float(len(plan.buckets))}

    async def _check_received(self, version: int) -> int:
        """Each worker's sampled tensors of a streamed push, as received, against what its model holds now."""
        checked = 0
        for compared, wrong in await self._started().collective_rpc(received_mismatches):  # type: ignore[arg-type]
            if wrong:
                raise WeightInstallError(f"engine {self.name}: after loading streamed weight version {version}, "
                                         f"{len(wrong)} of {compared} checked tensors differ from those received "
                                         f"(e.g. {wrong[:3]})")
            checked += compared
        return checked

    async def _check_served(self, tensors: NamedTensors, version: int) -> int:
        """Digests of a sample of the pushed tensors against what every worker's model holds now; raises
        `WeightInstallError` naming those that differ. Returns how many tensors were compared."""
        served = await self.weight_digests(sampled_names({name: t.dim() for name, t in tensors.items()}, version))
        checked = 0
        for held in served:
            compared, wrong = mismatches(tensors, held)
            if wrong:
                raise WeightInstallError(f"engine {self.name}: after loading weight version {version}, {len(wrong)} "
                                         f"of {compared} checked tensors differ from those pushed (e.g. {wrong[:3]})")
            checked += compared
        return checked

    async def weight_digests(self, names: list[str]) -> list[Served]:
        """Shape, dtype and SHA-256 of each named tensor every worker's model holds (one dict per worker)."""
        return await self._started().collective_rpc(served_digests(names))  # type: ignore[arg-type]

    async def check_weights(self, named_tensors: NamedTensors) -> tuple[int, list[str]]:
        """Every tensor of `named_tensors` that the engine holds by that name and shape, compared with what it
        serves: (how many compared, those that differ)."""
        tensors = dict(named_tensors)
        compared, wrong = 0, set[str]()
        for held in await self.weight_digests(sorted(tensors)):
            count, differ = mismatches(tensors, held)
            compared, wrong = max(compared, count), wrong | set(differ)
        return compared, sorted(wrong)
