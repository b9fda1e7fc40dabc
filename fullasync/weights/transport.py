"""How one weight version travels from the trainer's export into every engine: the `WeightTransport` seam.

Owns: the transport protocol — one push is a transaction `start_weight_update(weights, version)` → one
`update_weights(engine, ...)` per engine → `finish_weight_update(version)`, the shape of vLLM's own
weight-transfer API (`start_weight_update` → `update_weights` → `finish_weight_update(weight_version)`) —
and `ObjectStoreTransport`, the transport of the CPU stack: the trainer's export is a Ray object reference,
each engine actor receives it from Ray's object store in its `install` call (one round trip per engine), and
hands it to its vLLM engine's workers through vLLM's own weight-transfer API (`start_weight_update` →
`update_weights` → `finish_weight_update(version)`) with the shared-memory backend registered in vLLM's factory
(`weights/vllm.py`, buckets in `weights/shm.py`).
Does not own: when a push happens, which engines take part, or what a failed engine gets later
(`weights/sync.py`); pausing and resuming inside an engine (`Engine.install`).

`StreamTransport` streams from the trainer's ranks instead (`weights/stream.py`): `start_weight_update` plans the
push for the engines taking part and sets the trainer's ranks sending, `update_weights` has one engine join the
broadcast between its pause and resume (an engine asked again — a retry — or not planned for gets a push of its
own), `finish_weight_update` waits for the senders. NCCL or IPC on GPU fit the same three calls. A push that
fails never reaches `finish_weight_update`; the next `start_weight_update` begins afresh. What a restarted engine
loads (`materialize`): the payload itself, or for a streamed one the trainer's gathered weights while it still
holds that version (`WeightsMovedOn` once it has stepped on: the restart waits for the next push).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fullasync.contracts.engine import Engine, InstallTiming, PauseMode
from fullasync.contracts.weights import StreamedWeights, StreamingTrainer, WeightsPayload, WeightTransport

if TYPE_CHECKING:
    from fullasync.weights.stream import StreamPlan

STREAM_BUCKET_BYTES = 64 * 2**20  # a streamed push's buckets of whole layers (each rank holds at most two)
STREAM_TIMEOUT_S = 120.0  # a member of a streamed push that waits this long for the others gives up


class ObjectStoreTransport:
    """Weights through Ray's object store to each engine actor, then shared memory to its engine core.

    The payload is passed as is to `Engine.install`: a Ray object reference travels as a reference (Ray resolves
    it in the actor, reading the tensors without a copy), a mapping of tensors (in process, the simulator) as
    itself. Nothing is copied here.
    """

    def __init__(self) -> None:
        self._pushing: tuple[WeightsPayload, int] | None = None  # the started push: weights and version

    async def start_weight_update(self, weights: WeightsPayload | StreamedWeights, version: int,
                                  engines: Sequence[Engine]) -> None:
        if isinstance(weights, StreamedWeights):
            raise TypeError("the trainer streams its weights (trainer.weight_transport=stream) but this push goes "
                            "through the object store: build WeightSync with StreamTransport(trainer)")
        self._pushing = (weights, version)

    async def update_weights(self, engine: Engine, version: int, mode: PauseMode) -> InstallTiming:
        if self._pushing is None or self._pushing[1] != version:
            raise RuntimeError(f"ObjectStoreTransport.update_weights(version={version}) without a started push of "
                               "that version: call start_weight_update first")
        return await engine.install(self._pushing[0], version, mode)

    async def finish_weight_update(self, version: int) -> None:
        self._pushing = None

    async def materialize(self, weights: WeightsPayload | StreamedWeights) -> WeightsPayload:
        if isinstance(weights, StreamedWeights):
            raise TypeError("a streamed push's weights reach a restarted engine through StreamTransport")
        return weights


@dataclass
class _StreamedPush:
    version: int
    plan: StreamPlan
    offsets: dict[str, int]  # each planned engine's first rank in the push's group
    senders: list[asyncio.Future[dict[str, str]]]
    joined: set[str] = field(default_factory=set)
    abandoned: bool = False  # an engine failed its part: the others go on with pushes of their own


class StreamTransport:
    """Weights streamed from the trainer's ranks into every engine's workers, one broadcast per push.

    The trainer's rank 0 is rank 0 of the push's group; each engine's workers follow at its offset. Every planned
    engine joins the one broadcast; when a member fails, the whole broadcast fails with it (its connections close:
    the others learn at once), and each engine is retried with a push of its own, as is one not planned for.
    """

    def __init__(self, trainer: StreamingTrainer, bucket_bytes: int = STREAM_BUCKET_BYTES,
                 timeout_s: float = STREAM_TIMEOUT_S) -> None:
        self.trainer = trainer
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self._push: _StreamedPush | None = None

    async def start_weight_update(self, weights: WeightsPayload | StreamedWeights, version: int,
                                  engines: Sequence[Engine]) -> None:
        if not isinstance(weights, StreamedWeights):
            raise TypeError(f"StreamTransport pushes what the trainer streams (StreamedWeights), got "
                            f"{type(weights).__name__}: set trainer.weight_transport=stream")
        offsets, rank = {}, 1
        for engine in engines:
            offsets[engine.name], rank = rank, rank + engine.workers
        plan = await self.trainer.stream_plan(version, rank, self.bucket_bytes, self.timeout_s)
        self._push = _StreamedPush(version, plan, offsets, [asyncio.ensure_future(self.trainer.stream_weights(plan))])

    async def update_weights(self, engine: Engine, version: int, mode: PauseMode) -> InstallTiming:
        push = self._push
        if push is None or push.version != version:
            raise RuntimeError(f"StreamTransport.update_weights(version={version}) without a started push of that "
                               "version: call start_weight_update first")
        if engine.name in push.offsets and engine.name not in push.joined and not push.abandoned:
            push.joined.add(engine.name)
            try:
                return await engine.install(push.plan.for_engine(push.offsets[engine.name]), version, mode)
            except BaseException:
                from fullasync.weights.stream import abandon  # torch: loaded by streamed pushes only

                # the broadcast cannot go on without this engine: the others (joined or not) learn it at once
                push.abandoned = True
                if not push.senders[0].done():
                    await asyncio.to_thread(abandon, push.plan)
                raise
        own = await self.trainer.stream_plan(version, 1 + engine.workers, self.bucket_bytes, self.timeout_s)
        push.senders.append(asyncio.ensure_future(self.trainer.stream_weights(own)))
        return await engine.install(own, version, mode)

    async def finish_weight_update(self, version: int) -> None:
        push, self._push = self._push, None
        if push is not None:  # every engine installed: a sender that failed was retried by a push of its own
            await asyncio.gather(*push.senders, return_exceptions=True)

    async def materialize(self, weights: WeightsPayload | StreamedWeights) -> WeightsPayload:
        if isinstance(weights, StreamedWeights):
            return await self.trainer.gather_weights(weights.step)
        return weights


def weight_transport(kind: str, trainer: StreamingTrainer) -> WeightTransport:
    """The transport `kind` names (the config's `trainer.weight_transport`: object_store or stream)."""
    if kind == "stream":
        return StreamTransport(trainer)
    if kind == "object_store":
        return ObjectStoreTransport()
    raise ValueError(f"trainer.weight_transport={kind!r}: choose object_store or stream")
