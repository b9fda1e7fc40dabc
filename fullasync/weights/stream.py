"""Streams weights from the trainer's ranks straight into the engines' workers, bucket by bucket, over gloo.

Owns: the wire protocol of the streamed push — its plan (`StreamPlan`: the tensors' names, dtypes and shapes,
packed into buckets of whole layers, known to both sides before a byte moves), the process group of one push
(the trainer's rank 0 as root, then every worker of every engine taking part, each at its engine's offset plus its
tensor-parallel rank), the sender (`send`: checks each tensor against the plan, packs a bucket, broadcasts it while
the next one is gathered) and the receiver (`receive`: each bucket's tensors handed to vLLM's loader as they
arrive). After the last bucket the root broadcasts the SHA-256 of the tensors the push checks (`sampled_names`), as
sent; each worker compares them with what it received before the engine serves anything, and keeps those tensors
so that the engine can compare them with what its model holds once loaded (`weight_digests.mismatches`).
Does not own: iterating the trainer's tensors (`trainer/worker.py`), which engines take part and what a failure
leads to (`weight_transport.StreamTransport`, `weights/sync.py`), vLLM's side of the API (`weights/vllm.py`).

Why: the object-store transport gathers the whole model on the trainer's rank 0, puts it in Ray's object store and
copies it once more into shared memory on each engine's node. Streamed, no process holds more of it than the
tensor being gathered and two buckets, the bytes are copied once into a bucket and once into vLLM's parameters, and
the same broadcast reaches engines on other nodes (gloo over TCP; NCCL fills the same role on GPUs). A tensor the
plan ties to the one before it (tied embeddings and output layer) travels once.
"""

from __future__ import annotations

import select
import socket
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from fullasync.weights.digests import digest, sampled_names
from fullasync.weights.shm import BucketsAsData, TensorEntry, aligned, group_key

if TYPE_CHECKING:
    from torch.distributed import Store, Work

DIGEST_BYTES = 32  # SHA-256
JOINED, ABANDONED = "joined/", "abandoned"  # keys in the push's rendezvous store: a member's (+ rank), the root's
ABANDON_LINGER_S = 5.0  # an abandoned push's store stays up this long for members on their way (they give up at once)
JOIN_POLL_S = 0.005
ABANDON_TIMEOUT_S = 30.0  # how long `abandon` knocks for a root that is only starting its push
Loader = Callable[[list[tuple[str, torch.Tensor]]], object]  # what it returns is not read


@dataclass(frozen=True)
class StreamPlan(BucketsAsData):
    """One streamed push as both sides know it before it starts: where to meet, who is who, what comes in which
    bucket."""

    address: str  # where the trainer's rank 0 listens for this push's rendezvous
    port: int
    control_port: int  # where it listens for `abandon` while its members join
    world_size: int  # 1 (the trainer's rank 0) + every worker of every engine taking part
    version: int
    buckets: tuple[tuple[TensorEntry, ...], ...]
    timeout_s: float = 300.0
    rank_offset: int = 1  # the receiving engine's first rank (its tensor-parallel ranks follow)

    @property
    def sampled(self) -> list[str]:
        """The tensors whose digests travel after the last bucket (those the push checks)."""
        return sampled_names({e.name: len(e.shape) for bucket in self.buckets for e in bucket}, self.version)

    def for_engine(self, rank_offset: int) -> StreamPlan:
        return replace(self, rank_offset=rank_offset)


Metadata = tuple[str, str, tuple[int, ...], str]  # name, dtype, shape, and the earlier tensor it is ("": none)


def plan_buckets(metadata: Iterable[Metadata], bucket_bytes: int) -> tuple[tuple[TensorEntry, ...], ...]:
    """(name, dtype, shape, same as) in the order the sender yields them, packed into buckets of whole layers up to
    `bucket_bytes` each (a bigger layer gets a bucket of its own); a layer's tensors must come together. A tensor
    that is an earlier one of its layer (tied embeddings and output layer) shares its bytes."""
    buckets: list[tuple[TensorEntry, ...]] = []
    current: list[TensorEntry] = []
    pending: list[Metadata] = []
    key = None
    used = 0

    def close_layer() -> None:
        nonlocal current, used
        size = sum(aligned(_nbytes(dtype, shape)) for _, dtype, shape, same in pending if not same)
        if current and used + size > bucket_bytes:
            buckets.append(tuple(current))
            current, used = [], 0
        placed = {entry.name: entry for entry in current}
        for name, dtype, shape, same in pending:
            if same:
                placed[name] = TensorEntry(name, dtype, tuple(shape), placed[same].offset, placed[same].nbytes)
            else:
                placed[name] = TensorEntry(name, dtype, tuple(shape), used, _nbytes(dtype, shape))
                used += aligned(_nbytes(dtype, shape))
            current.append(placed[name])
        pending.clear()

    for name, dtype, shape, same in metadata:
        if pending and group_key(name) != key:
            close_layer()
        key = group_key(name)
        if same and same not in {entry[0] for entry in pending}:
            raise ValueError(f"{name} shares the bytes of {same}, which is not an earlier tensor of its layer")
        pending.append((name, dtype, tuple(shape), same))
    close_layer()
    if current:
        buckets.append(tuple(current))
    return tuple(buckets)


def _nbytes(dtype: str, shape: Iterable[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count * getattr(torch, dtype).itemsize


def _bucket_bytes(bucket: tuple[TensorEntry, ...]) -> int:
    return max(entry.offset + aligned(entry.nbytes) for entry in bucket)


class PushGroup:
    """The process group of one push: the trainer's rank 0 hosts the rendezvous (a TCP store) and is the root.

    Every socket it opens is on an address of the plan's network: the store listens on the plan's address only (a
    TCP store given just a host listens on every interface), and each member's gloo connections use the local
    address that routes to it (127.0.0.1 on one machine).
    """

    def __init__(self, plan: StreamPlan, rank: int) -> None:
        import torch.distributed as dist

        timeout = timedelta(seconds=plan.timeout_s)
        deadline = time.monotonic() + plan.timeout_s
        listen_fd: int | None = None  # None: the store opens its own socket (TCPStore's default)
        control = None
        if rank == 0:
            control = listen(plan.address, plan.control_port)  # `abandon` knocks here
            listen_fd = listen(plan.address, plan.port).detach()  # the store owns it from here
        else:
            # the store's client retries a refused connection only after a random delay of up to a tenth of its
            # timeout (seconds to minutes): a member that comes first waits for the root's port itself
            until_listening(plan.address, plan.port, deadline)
        self._store: Store | None = dist.TCPStore(plan.address, plan.port, world_size=None, is_master=rank == 0,
                                                  timeout=timeout, wait_for_workers=False, master_listen_fd=listen_fd)
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's way to pick the device
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=_local_address(plan.address, plan.port))]
        options._timeout = timeout
        store = dist.PrefixStore(f"fullasync-push-{plan.version}", self._store)
        try:
            if control is not None:
                _wait_for_members(store, plan, control, deadline)
            elif store.check([ABANDONED]):
                raise PushAbandoned(f"weight version {plan.version}: the push was abandoned before this engine joined")
            else:
                store.set(f"{JOINED}{rank}", "")
            # Any: torch's stub of ProcessGroupGloo has neither this constructor (options) nor `broadcast`
            self._group: Any = dist.ProcessGroupGloo(store, rank, plan.world_size, options)
        except BaseException as error:
            # drop the store's last references (the traceback keeps the frames it passed through): the root's then
            # stops listening, so the members waiting in the rendezvous fail at once
            traceback.clear_frames(error.__traceback__)
            del store
            self._store = None
            raise
        finally:
            if control is not None:
                control.close()
        self._options = dist.BroadcastOptions()
        self._options.rootRank = 0
        self._options.rootTensor = 0

    def broadcast(self, buffer: torch.Tensor) -> Work:
        """Start broadcasting `buffer` from the root (filled there, overwritten elsewhere); wait on what it returns."""
        return self._group.broadcast([buffer], self._options)

    def __enter__(self) -> PushGroup:
        return self

    def __exit__(self, *_: object) -> None:
        # the group's last reference: destroying it closes its connections, so after a failure the other members
        # fail at once ("connection closed by peer") instead of at their timeout (gloo's abort does not close them)
        self._group = self._store = None


class PushAbandoned(RuntimeError):
    """The push was given up before every member joined it (one of its engines failed first)."""


def _wait_for_members(store: Store, plan: StreamPlan, control: socket.socket, deadline: float) -> None:
    """The root waits until every member has said it joined, or someone knocked on its control socket
    (`abandon`), or its timeout passed: a member that never comes does not hold the others in gloo's rendezvous."""
    members = [f"{JOINED}{rank}" for rank in range(1, plan.world_size)]
    while not store.check(members):
        if select.select([control], [], [], 0)[0]:
            store.set(ABANDONED, "")  # for members still on their way: they give up as they come
            time.sleep(ABANDON_LINGER_S)
            raise PushAbandoned(f"weight version {plan.version}: the push was abandoned before every engine joined")
        if time.monotonic() > deadline:
            raise TimeoutError(f"weight version {plan.version}: not every engine joined the push within "
                               f"{plan.timeout_s:.0f} s")
        time.sleep(JOIN_POLL_S)


def abandon(plan: StreamPlan) -> None:
    """Tell a push's root, waiting for its members, to give up: its store closes, so every member waiting fails at
    once. A knock on its control socket; nothing happens when nobody listens there within `ABANDON_TIMEOUT_S`."""
    try:
        until_listening(plan.address, plan.control_port, time.monotonic() + ABANDON_TIMEOUT_S)
    except TimeoutError:
        return  # the push is over, or its root never started: nobody to tell


def until_listening(address: str, port: int, deadline: float) -> None:
    """Connect to address:port (and hang up) as soon as something listens there; TimeoutError past `deadline`."""
    while True:
        try:
            with socket.create_connection((address, port), timeout=max(0.1, deadline - time.monotonic())):
                return
        except (ConnectionRefusedError, TimeoutError) as error:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listened on {address}:{port} in time") from error
            time.sleep(JOIN_POLL_S)


def _local_address(host: str, port: int) -> str:
    """This host's address on the route to host:port (a UDP socket's connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return str(probe.getsockname()[0])


def listen(address: str, port: int) -> socket.socket:
    """A socket listening on address:port only (a TCP store given just a host listens on every interface)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen()
    return listener


def free_ports(address: str, count: int) -> list[int]:
    """`count` ports free on `address` now (the rendezvous and control ports of a push)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((address, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def send(plan: StreamPlan, tensors: Iterator[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """The root's side: pack and broadcast every bucket of `plan` from `tensors` (yielded in the plan's order,
    checked against it), then the digests of the sampled ones. Returns those digests (hex), as sent."""
    expected = [entry for bucket in plan.buckets for entry in bucket]
    sampled = set(plan.sampled)
    digests: dict[str, str] = {}
    on_the_wire: list[Work] = []  # the bucket being broadcast (its work holds the group): emptied on the way out
    position = 0
    with PushGroup(plan, 0) as group:
        try:
            for bucket in plan.buckets:
                buffer = torch.empty(_bucket_bytes(bucket), dtype=torch.uint8)
                written: set[int] = set()
                for entry in bucket:
                    name, tensor = next(tensors, (None, None))
                    if name is None or tensor is None:
                        raise ValueError(f"the trainer yielded {position} tensors; the push's plan has "
                                         f"{len(expected)}")
                    if (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)) != \
                            (entry.name, entry.dtype, entry.shape):
                        raise ValueError(f"tensor {position} of the push is {name} {tensor.dtype} "
                                         f"{tuple(tensor.shape)}; the plan says {entry.name} {entry.dtype} "
                                         f"{entry.shape}")
                    raw = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8)
                    part = buffer[entry.offset:entry.offset + entry.nbytes]
                    if entry.offset not in written:
                        part.copy_(raw)
                        written.add(entry.offset)
                    elif not torch.equal(part, raw):  # a tied tensor: its bytes are there already, its own
                        raise ValueError(f"{name} shares an earlier tensor's bytes in the plan but differs from it")
                    if name in sampled:
                        digests[name] = digest(raw)
                    position += 1
                if on_the_wire:
                    on_the_wire.pop().wait()  # the previous bucket is out before its buffer is dropped
                on_the_wire.append(group.broadcast(buffer))
            extra = next(tensors, None)
            if extra is not None:
                raise ValueError(f"the trainer yielded more tensors than the push's plan has ({len(expected)}); "
                                 f"the first extra is {extra[0]}")
            if on_the_wire:
                on_the_wire.pop().wait()
            sent = b"".join(bytes.fromhex(digests[name]) for name in plan.sampled)
            group.broadcast(torch.frombuffer(bytearray(sent), dtype=torch.uint8)).wait()
        finally:
            on_the_wire.clear()
    return {name: digests[name] for name in plan.sampled}


def receive(plan: StreamPlan, rank: int, load: Loader) -> dict[str, torch.Tensor]:
    """A worker's side: take every bucket of `plan` and `load` its tensors; then check the sampled ones against the
    root's digests. Returns the sampled tensors as received (for the check against what the model holds)."""
    sampled = set(plan.sampled)
    kept: dict[str, torch.Tensor] = {}
    with PushGroup(plan, rank) as group:
        for bucket in plan.buckets:
            buffer = torch.empty(_bucket_bytes(bucket), dtype=torch.uint8)
            group.broadcast(buffer).wait()
            tensors = [(entry.name, buffer[entry.offset:entry.offset + entry.nbytes]
                        .view(getattr(torch, entry.dtype)).view(entry.shape)) for entry in bucket]
            kept.update((name, tensor.clone()) for name, tensor in tensors if name in sampled)
            load(tensors)
        blob = torch.empty(DIGEST_BYTES * len(plan.sampled), dtype=torch.uint8)
        group.broadcast(blob).wait()
    sent = blob.numpy().tobytes()
    wrong = [name for i, name in enumerate(plan.sampled)
             if bytes.fromhex(digest(kept[name])) != sent[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES]]
    if wrong:
        raise ValueError(f"weight version {plan.version}: {len(wrong)} of {len(plan.sampled)} checked tensors "
                         f"arrived otherwise than sent (e.g. {wrong[:3]})")
    return kept
