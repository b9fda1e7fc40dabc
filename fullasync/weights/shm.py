"""Hands weights from the engine actor to vLLM's engine-core process through shared memory, in buckets.

Owns: the layout (tensors grouped by layer, layers packed into buckets), the one /dev/shm file of two
slots the buckets pass through, the hand-off protocol, and the worker-side iterator vLLM loads from
(`weights/vllm.py`). Does not own: when a push happens (`weights/sync.py`) or the engine (`engines/vllm/`).

Why: vLLM's RPC pickles its arguments through ZMQ to the engine-core process; for a 135M model
that is hundreds of MB pickled, sent and unpickled per push. Here the RPC carries only the layout
(names, dtypes, shapes, offsets) and the bytes go through memory both processes map.

Protocol (one push = one `update_weights` of vLLM's weight-transfer API, whose backend —
`vllm_transfer.FullasyncTransferEngine` — loads from a `WeightReceiver` on every worker of the engine: one
per tensor-parallel rank, each reading the whole model, which vLLM's weight loaders shard):
the control block holds, per slot, the last bucket filled (`filled[s]`, written by the sender) and, per
reader and slot, the last bucket released (`released[r][s]`, written by reader r), all counted from 1,
plus the push id. The sender copies bucket i into slot i % 2 once every reader released bucket i − 2,
then publishes i + 1 in `filled[i % 2]`; a reader waits for that, yields views of the slot's tensors, and
when asked for the tensor after the bucket's last one publishes i + 1 in its `released[r][i % 2]`. A
bucket holds whole layers, and vLLM processes (repacks) a layer as soon as its last tensor is loaded, so
nothing it keeps refers to a slot once that slot is released. Copies per push: one by the sender into a slot,
then vLLM's own into its parameters. Peak extra memory: the file, 2 × `slot_bytes` (kept between
pushes so its pages are not faulted in again).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self, TypeAlias

import torch

CONTROL_BYTES = 4096  # filled[2], push id, failed flag, then released[reader][2] (int64 each), page aligned
ALIGN = 64
_FILLED, _PUSH, _FAILED, _RELEASED = 0, 2, 3, 8  # indices into the control block's int64s
_CONTROL_WORDS = CONTROL_BYTES // 8
MAX_READERS = (_CONTROL_WORDS - _RELEASED) // 2  # workers of one engine reading a push (its tensor-parallel ranks)
_LAYER = re.compile(r"^(.*\.layers\.\d+)\.")
_TIED = ("model.embed_tokens.weight", "lm_head.weight")
SHM_DIR = "/dev/shm"  # where the hand-off file lives (Docker's default size: 64 MiB)


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in its bucket's slot."""

    name: str
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the slot
    nbytes: int


class BucketsAsData:
    """A dataclass with `buckets` of `TensorEntry`s as plain data and back (it crosses Ray and vLLM's RPC)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]  # subclasses are dataclasses

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        buckets = tuple(tuple(TensorEntry(**{**entry, "shape": tuple(entry["shape"])}) for entry in bucket)
                        for bucket in data["buckets"])
        return cls(**{**data, "buckets": buckets})


@dataclass(frozen=True)
class BucketLayout(BucketsAsData):
    """What the receiver needs to read one push: file, slot size, and each bucket's tensors in order."""

    path: str
    slot_bytes: int
    push_id: int
    buckets: tuple[tuple[TensorEntry, ...], ...]
    timeout_s: float = 120.0  # the receiver gives up waiting for a bucket after this long
    readers: int = 1  # workers that read every bucket (the engine's tensor-parallel ranks on this node)


Bucket: TypeAlias = "list[tuple[TensorEntry, torch.Tensor]]"  # whole layers: each tensor's place and its source


def group_key(name: str) -> str:
    """Tensors of one layer share a key; tied embeddings and output layer share one."""
    if name in _TIED:
        return "tied-embeddings"
    match = _LAYER.match(name)
    return match.group(1) if match else name


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class SharedMemoryTooSmallError(RuntimeError):
    """/dev/shm cannot hold what an engine's pushes need; the message says how much and how to raise it."""


def hand_off_bytes(layer_bytes: Iterable[int], bucket_bytes: int) -> int:
    """The most an engine's hand-off file takes: the control block and two slots, each a bucket of `bucket_bytes`
    or the largest layer where one is bigger (`plan_buckets`)."""
    return CONTROL_BYTES + 2 * max([bucket_bytes, *layer_bytes])


def model_layer_bytes(model_dir: Path, dtype: torch.dtype) -> list[int]:
    """The bytes of each layer (`group_key`) of the model's safetensors weights in `dtype`, read from the files'
    headers (nothing loaded); [] for a model without safetensors files."""
    from safetensors import safe_open

    sizes: dict[str, int] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as weights:
            for name in weights.keys():  # safe_open is not a mapping
                numel = math.prod(weights.get_slice(name).get_shape())
                sizes[group_key(name)] = sizes.get(group_key(name), 0) + aligned(numel * dtype.itemsize)
    return list(sizes.values())


def check_room(needed: int, directory: str = SHM_DIR) -> None:
    """Raise SharedMemoryTooSmallError when `directory` has less than `needed` bytes free: a push would otherwise
    die mid-copy (SIGBUS on a full tmpfs) instead of failing here, at the engine's start."""
    stats = os.statvfs(directory)
    free, size = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    if needed > free:
        raise SharedMemoryTooSmallError(
            f"an engine's weight pushes need {needed / 2**20:.0f} MiB of {directory} (two buckets of whole layers; "
            f"VLLMEngineConfig.weight_bucket_bytes) and {free / 2**20:.0f} MiB of its {size / 2**20:.0f} MiB is "
            f"free: give the node more (a container: --shm-size=16g; a host: mount -o remount,size=16G {directory})")


def plan_buckets(tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> tuple[list[Bucket], int]:
    """Buckets of whole layers, each up to `bucket_bytes` (a bigger layer gets a bucket of its own).

    A tensor viewing the same memory as an earlier one (tied embeddings) shares its bytes.
    Returns the buckets (entry, source tensor) and the slot size they need.
    """
    groups: dict[str, list[str]] = {}
    for name in tensors:
        groups.setdefault(group_key(name), []).append(name)
    buckets: list[Bucket] = []
    current: Bucket = []
    used = 0
    slot_bytes = 0
    for names in groups.values():
        group_bytes = sum(aligned(tensors[n].numel() * tensors[n].element_size()) for n in names)
        if current and used + group_bytes > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        placed: dict[tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]], TensorEntry] = {}
        for name in names:
            tensor = tensors[name]
            key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
            shared = placed.get(key) if tensor.numel() else None
            nbytes = tensor.numel() * tensor.element_size()
            offset = shared.offset if shared is not None else used
            entry = TensorEntry(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, nbytes)
            current.append((entry, tensor))
            if shared is None:
                placed[key] = entry
                used += aligned(nbytes)
        slot_bytes = max(slot_bytes, used)
    if current:
        buckets.append(current)
    return buckets, max(slot_bytes, ALIGN)


def _map(path: str, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)


def _slot(buffer: mmap.mmap, slot_bytes: int, slot: int) -> torch.Tensor:
    return torch.frombuffer(buffer, dtype=torch.uint8, count=slot_bytes, offset=CONTROL_BYTES + slot * slot_bytes)


def _released(reader: int, slot: int) -> int:
    return _RELEASED + 2 * reader + slot


def _control(buffer: mmap.mmap) -> torch.Tensor:
    return torch.frombuffer(buffer, dtype=torch.int64, count=_CONTROL_WORDS)


def _view(slot: torch.Tensor, entry: TensorEntry) -> torch.Tensor:
    raw = slot[entry.offset:entry.offset + entry.nbytes]
    return raw.view(getattr(torch, entry.dtype)).view(entry.shape)


def remove_orphans(directory: str) -> list[str]:
    """Delete hand-off files whose engine actor is gone (killed before it could remove its own); their names."""
    removed = []
    for name in os.listdir(directory):
        parts = name.split("-")
        if name.startswith("fullasync-weights-") and len(parts) >= 4 and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
            except ProcessLookupError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
                removed.append(name)
            except PermissionError:  # alive, another user's
                pass
    return removed


class WeightSender:
    """The actor's end: owns the /dev/shm file (grown when a push needs bigger slots), fills buckets."""

    def __init__(self, bucket_bytes: int, directory: str = SHM_DIR) -> None:
        self.bucket_bytes = bucket_bytes
        self.directory = directory if os.path.isdir(directory) else tempfile.gettempdir()
        self.path = ""
        self.slot_bytes = 0
        self._buffer: mmap.mmap | None = None
        self._pushes = 0
        self._readers = 1  # of the prepared push

    @property
    def file_bytes(self) -> int:
        """Extra memory held: the shared file (control block and two slots)."""
        return CONTROL_BYTES + 2 * self.slot_bytes if self._buffer is not None else 0

    def prepare(self, tensors: Mapping[str, torch.Tensor], timeout_s: float,
                readers: int = 1) -> tuple[BucketLayout, list[Bucket]]:
        """Plan this push for `readers` receivers and reset the control block; returns the layout for the
        receivers and the plan."""
        if not 1 <= readers <= MAX_READERS:
            raise ValueError(f"a weight hand-off has 1 to {MAX_READERS} readers (one per tensor-parallel rank), "
                             f"got {readers}")
        buckets, slot_bytes = plan_buckets(tensors, self.bucket_bytes)
        if slot_bytes > self.slot_bytes:
            self.close()
            remove_orphans(self.directory)
            self.path = os.path.join(self.directory, f"fullasync-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            with open(self.path, "wb") as file:
                file.truncate(CONTROL_BYTES + 2 * slot_bytes)
            self.slot_bytes = slot_bytes
            self._buffer = _map(self.path, CONTROL_BYTES + 2 * slot_bytes)
        self._pushes += 1
        control = self._control()
        control.zero_()
        control[_PUSH] = self._pushes
        self._readers = readers
        layout = BucketLayout(self.path, self.slot_bytes, self._pushes,
                              tuple(tuple(entry for entry, _ in bucket) for bucket in buckets), timeout_s, readers)
        return layout, buckets

    def send(self, buckets: list[Bucket], stop: threading.Event, timeout_s: float) -> float:
        """Copy the buckets into the slots as the receiver frees them; seconds spent copying.

        Returns early if `stop` is set (the receiving RPC ended, e.g. with an error).
        """
        control, buffer = self._control(), self._mapped()
        copying = 0.0
        for index, bucket in enumerate(buckets):
            slot = index % 2
            deadline = time.monotonic() + timeout_s
            while index >= 2 and self._slowest_release(control, slot) < index - 1:
                if stop.is_set() or int(control[_FAILED]):
                    return copying
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the engine did not take weight bucket {index - 1} within {timeout_s:.0f} s")
                time.sleep(0.0002)
            started = time.perf_counter()
            target = _slot(buffer, self.slot_bytes, slot)
            for entry, tensor in bucket:
                _view(target, entry).copy_(tensor)
            copying += time.perf_counter() - started
            control[_FILLED + slot] = index + 1
        return copying

    def _slowest_release(self, control: torch.Tensor, slot: int) -> int:
        return min(int(control[_released(reader, slot)]) for reader in range(self._readers))

    def abandon(self) -> None:
        """Tell a receiver still waiting that no more buckets come."""
        if self._buffer is not None:
            self._control()[_FAILED] = 1

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
            os.unlink(self.path)
            self.slot_bytes = 0

    def _mapped(self) -> mmap.mmap:
        if self._buffer is None:
            raise RuntimeError("WeightSender: prepare() a push before sending it")
        return self._buffer

    def _control(self) -> torch.Tensor:
        return _control(self._mapped())


class WeightReceiver:
    """The engine-core worker's end: maps the file once and yields each push's tensors as views."""

    def __init__(self) -> None:
        self.path = ""
        self._buffer: mmap.mmap | None = None

    def tensors(self, layout: BucketLayout, reader: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of every bucket in order, each bucket released (as reader `reader` of the layout's
        readers) once the next is asked for."""
        if not 0 <= reader < layout.readers:
            raise ValueError(f"weight hand-off: reader {reader} of a push prepared for {layout.readers} readers "
                             "(the engine's workers on this node)")
        if layout.path != self.path:
            if self._buffer is not None:
                self._buffer.close()
            self._buffer = _map(layout.path, CONTROL_BYTES + 2 * layout.slot_bytes)
            self.path = layout.path
        buffer = self._buffer
        assert buffer is not None  # mapped above, or by an earlier push of the same file
        control = _control(buffer)
        if int(control[_PUSH]) != layout.push_id:
            raise RuntimeError(f"weight hand-off: push {layout.push_id} expected, the file holds {int(control[_PUSH])}")
        try:
            for index, bucket in enumerate(layout.buckets):
                slot = index % 2
                deadline = time.monotonic() + layout.timeout_s
                while int(control[_FILLED + slot]) < index + 1:
                    if int(control[_FAILED]):
                        raise RuntimeError("weight hand-off: the sender gave up")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"weight hand-off: bucket {index} did not arrive in "
                                           f"{layout.timeout_s:.0f} s")
                    time.sleep(0.0002)
                source = _slot(buffer, layout.slot_bytes, slot)
                for entry in bucket:
                    yield entry.name, _view(source, entry)
                control[_released(reader, slot)] = index + 1
        except BaseException:
            control[_FAILED] = 1
            raise

    def close(self) -> None:
        if self._buffer is not None:
            with contextlib.suppress(BufferError):  # a tensor still viewing it keeps it mapped until collected
                self._buffer.close()
            self._buffer, self.path = None, ""
