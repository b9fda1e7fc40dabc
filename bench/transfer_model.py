"""The weight-push transfer model: what one push of a 0.5B / 8B / 70B model costs over each transport.

Bandwidths measured on this machine (best of 3): a host memory copy (torch), a copy into a /dev/shm mapping (the
engine's shared-memory buckets), a gloo broadcast between two processes on loopback, and a tensor through Ray's
object store from one process to another (put of a numpy view — the trainer's zero-copy export — then read in
an actor). GPU and network bandwidths are cited peaks
derated by `DERATE` (no GPU here): PCIe Gen5 x16 64 GB/s per direction, NVLink 4 on H100 SXM 450 GB/s per direction,
InfiniBand NDR 400 Gb/s (50 GB/s) per GPU rail, 100 GbE (12.5 GB/s) for Ray's object transfer between nodes, HBM3
3.35 TB/s (a device copy reads and writes: half).

Transports, for bf16 weights (2 bytes per parameter), one receiving engine:
- object store (today's path): gather on trainer rank 0 and copy to the host (PCIe D2H) → into Ray's object store
  (host copy) → to the engine's node (nothing within a node; 100 GbE between nodes) → into the shared-memory buckets
  (shm copy) → the engine loads them onto its GPU (PCIe H2D). The stages run one after another.
- NCCL broadcast (vLLM's `nccl` weight-transfer backend): GPU to GPU in buckets, pipelined: bytes / link bandwidth
  (NVLink within a node, an InfiniBand rail between nodes).
- CUDA IPC (vLLM's `ipc` backend, trainer and engine on the same GPU): the engine copies from the trainer's memory: a
  device-to-device copy.
With E engines the object store's network stage grows with E from one source node, a NCCL broadcast does not.

    .venv/bin/python bench/transfer_model.py      # also run at the end of bench/weight_push.py
"""

from __future__ import annotations

import mmap
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BEGIN, END = "<!-- transfer-model:begin -->", "<!-- transfer-model:end -->"
GB = 1e9
DERATE = 0.8  # share of a cited peak a bulk transfer reaches (assumed)
CITED_GB_S = {  # peaks, per direction
    "pcie_gen5_x16": 64.0,
    "nvlink4_h100": 450.0,
    "ib_ndr_rail": 50.0,
    "ethernet_100g": 12.5,
    "hbm3_copy": 3350.0 / 2,
}
MODELS = {"0.5B": 0.5e9, "8B": 8e9, "70B": 70e9}
BYTES_PER_PARAMETER = 2  # bf16
PROBE_BYTES = 256 * 2**20


def _best_rate(run: object, nbytes: int, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - began)
    return nbytes / best / GB


def memcpy_gb_s() -> float:
    source = torch.ones(PROBE_BYTES // 4)
    target = torch.empty_like(source)
    return _best_rate(lambda: target.copy_(source), PROBE_BYTES)


def shm_gb_s() -> float:
    source = torch.ones(PROBE_BYTES, dtype=torch.uint8)
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.NamedTemporaryFile(dir=folder) as handle:
        handle.truncate(PROBE_BYTES)
        with mmap.mmap(handle.fileno(), PROBE_BYTES) as mapped:
            rate = _shm_rate(torch.frombuffer(mapped, dtype=torch.uint8), source)  # the view is gone before close
    return rate


def _shm_rate(target: torch.Tensor, source: torch.Tensor) -> float:
    return _best_rate(lambda: target.copy_(source), PROBE_BYTES)


def _gloo_rank(rank: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tensor = torch.ones(PROBE_BYTES // 4) if rank == 0 else torch.empty(PROBE_BYTES // 4)
    dist.broadcast(tensor, src=0)  # warm-up
    rate = _best_rate(lambda: (dist.broadcast(tensor, src=0), dist.barrier()), PROBE_BYTES)
    if rank == 0:
        results["gloo"] = rate
    dist.destroy_process_group()


def gloo_gb_s() -> float:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_gloo_rank, args=(port, results), nprocs=2, join=True)
        return float(results["gloo"])


def ray_object_gb_s() -> float:
    import ray

    @ray.remote(num_cpus=0)
    class Reader:
        def read(self, array: Any) -> int:  # Ray resolves a top-level reference before the call
            return int(array[-1] > 0)

    reader = Reader.remote()  # type: ignore[attr-defined]
    array = torch.ones(PROBE_BYTES // 4).numpy()  # as the trainer exports: numpy views, read in place by the engine
    ray.get(reader.read.remote(ray.put(array)))  # warm-up

    def through_ray() -> None:
        ray.get(reader.read.remote(ray.put(array)))

    rate = _best_rate(through_ray, PROBE_BYTES)
    ray.kill(reader)
    return rate


@dataclass
class Bandwidths:
    memcpy: float
    shm: float
    gloo: float
    ray_object: float

    @property
    def gpu(self) -> dict[str, float]:
        return {name: peak * DERATE for name, peak in CITED_GB_S.items()}


def measure() -> Bandwidths:
    return Bandwidths(memcpy=memcpy_gb_s(), shm=shm_gb_s(), gloo=gloo_gb_s(), ray_object=ray_object_gb_s())


def push_seconds(nbytes: float, bw: Bandwidths) -> dict[str, float]:
    """Modelled seconds of one push of `nbytes` per transport (see the module docstring)."""
    gpu = bw.gpu
    host_stages = nbytes / (gpu["pcie_gen5_x16"] * GB) * 2 + nbytes / (bw.ray_object * GB) + nbytes / (bw.shm * GB)
    return {
        "object store, same node": host_stages,
        "object store, across nodes": host_stages + nbytes / (gpu["ethernet_100g"] * GB),
        "NCCL, NVLink (same node)": nbytes / (gpu["nvlink4_h100"] * GB),
        "NCCL, InfiniBand rail (across nodes)": nbytes / (gpu["ib_ndr_rail"] * GB),
        "CUDA IPC (same GPU)": nbytes / (gpu["hbm3_copy"] * GB),
    }


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


def render(bw: Bandwidths) -> str:
    lines = [
        "## Weight push: the transfer model",
        "",
        "`python bench/transfer_model.py` (also run by `bench/weight_push.py`). Measured here, best of 3 "
        f"({PROBE_BYTES // 2**20} MiB): host copy {bw.memcpy:.1f} GB/s, copy into /dev/shm {bw.shm:.1f} GB/s, "
        f"gloo broadcast over loopback {bw.gloo:.2f} GB/s, a tensor through Ray's object store to another process "
        f"{bw.ray_object:.2f} GB/s. Cited peaks × {DERATE} (no GPU here): "
        + ", ".join(f"{name} {value:.0f} GB/s" for name, value in bw.gpu.items()) + ".",
        "",
        "Modelled seconds of one push of bf16 weights into one engine (stages as the module docstring lists them):",
        "",
    ]
    transports = list(push_seconds(1.0, bw))
    lines.append("| model | bytes | " + " | ".join(transports) + " |")
    lines.append("|---|---|" + "---|" * len(transports))
    for name, parameters in MODELS.items():
        nbytes = parameters * BYTES_PER_PARAMETER
        seconds = push_seconds(nbytes, bw)
        lines.append(f"| {name} | {nbytes / GB:.0f} GB | " + " | ".join(_duration(seconds[t]) for t in transports)
                     + " |")
    best = push_seconds(MODELS["8B"] * BYTES_PER_PARAMETER, bw)
    lines += ["", "The host stages use this 2-core machine's bandwidths; a GPU node's host copies faster, so the "
              "object-store columns are an upper bound — but even at 10× these bandwidths they stay seconds to minutes "
              "where a GPU-to-GPU transfer takes milliseconds to seconds."]
    ratio = best["object store, same node"] / best["NCCL, NVLink (same node)"]
    lines += ["", f"8B: the object-store path costs {ratio:.0f}× "
              "a NCCL broadcast within a node; the host stages (PCIe both ways, the object store, shm) are the cost, "
              "which is why a GPU run should push GPU to GPU (issue: the vLLM weight-transfer seam)."]
    return "\n".join(lines)


def write(no_write: bool = False) -> None:
    """Measure, print, and (unless `no_write`) rewrite its section of docs/benchmarks/transfer-model.md (Ray must be
    up)."""
    from _report import report

    report(render(measure()), BEGIN, END, write=not no_write)


def main() -> None:
    import argparse

    from fullasync.infra.runtime import init_ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    init_ray()
    write(parser.parse_args().no_write)


if __name__ == "__main__":
    main()
