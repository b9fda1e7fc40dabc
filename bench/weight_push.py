"""Weight push cost at real sizes: one push of a model's full weights into a running vLLM engine.

For the tiny model and SmolLM2-135M-Instruct (float32, and bfloat16 in a bfloat16 engine): the floor
(one in-memory copy of the pushed bytes, best of 3), the push's wall time and its breakdown, and
their ratio. The push is what a training step does: export (a Ray actor returns the weights as a Ray
object, as the trainer's `export_weights` does) → transfer (Ray hands the object to the engine actor)
→ install (pause, copy into the shared-memory buckets and vLLM's reload, prefix-cache reset) →
resume; `WeightSync.push` drives it. Also: engine round trips per push (calls the driver makes to
the engine actor) and the extra memory the bucketed hand-off holds (its /dev/shm file: two slots).

Then the transfer model (`bench/transfer_model.py`): the same push at 0.5B / 8B / 70B over each transport.

    .venv/bin/python bench/weight_push.py [--pushes 3] [--bucket-mb 64] [--models tiny,smollm2,smollm2-bf16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass

import ray
import torch
import transfer_model
from _report import command_line, report

from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.infra.runtime import init_ray
from fullasync.weights.sync import WeightSync

BEGIN, END = "<!-- weight-push:begin -->", "<!-- weight-push:end -->"
MODELS = {"tiny": ("tiny", "float32"), "smollm2": ("smollm2-135m-instruct", "float32"),
          "smollm2-bf16": ("smollm2-135m-instruct", "bfloat16")}


def _model_path(name: str) -> str:
    from fullasync.models import build_pretrained_model, build_tiny_model

    return str(build_tiny_model() if name == "tiny" else build_pretrained_model(name))


def _weights(model_path: str, dtype: str) -> dict[str, torch.Tensor]:
    """The trainer's export format: HF names, lm_head listed (the same tensor as the embeddings when tied)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    weights = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights


def _unique(weights: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return list({id(t): t for t in weights.values()}.values())


def floor_s(weights: dict[str, torch.Tensor]) -> float:
    """One in-memory copy of the pushed bytes (into fresh memory), best of 3."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        copies = [t.clone() for t in _unique(weights)]
        best = min(best, time.perf_counter() - started)
        del copies
    return best


class Exporter:
    """Stands in for the trainer's rank 0: holds the weights, returns them as a Ray object per export."""

    def __init__(self, model_path: str, dtype: str) -> None:
        self.weights = _weights(model_path, dtype)

    def export(self) -> dict[str, torch.Tensor]:
        return self.weights


@dataclass
class PushFigures:
    label: str
    num_bytes: int
    floor_s: float
    wall_s: float
    export_s: float
    transfer_s: float
    pause_s: float
    copy_s: float
    load_s: float
    reset_s: float
    resume_s: float
    round_trips: float
    buckets: int
    shm_bytes: int

    @property
    def ratio(self) -> float:
        return self.wall_s / self.floor_s


async def measure(label: str, pushes: int, bucket_bytes: int, zero_copy_export: bool) -> PushFigures:
    name, dtype = MODELS[label]
    model_path = _model_path(name)
    weights = _weights(model_path, dtype)
    num_bytes = sum(t.numel() * t.element_size() for t in _unique(weights))
    floor = floor_s(weights)
    del weights
    env = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"} if zero_copy_export else {}
    exporter = ray.remote(Exporter).options(num_cpus=0, runtime_env={"env_vars": env}).remote(model_path, dtype)
    config = VLLMEngineConfig(model_path=model_path, dtype=dtype, max_model_len=512, max_num_seqs=8,
                              weight_bucket_bytes=bucket_bytes, call_timeout_s=600, start_timeout_s=1200)
    (engine,) = await launch_vllm_engines(config)
    sync = WeightSync([engine], version=await engine.version())
    rows = []
    try:
        for index in range(pushes + 1):  # the first push warms up (maps the hand-off file)
            calls = sum(engine.calls.values())
            started = time.perf_counter()
            ref = exporter.export.remote()
            await asyncio.to_thread(ray.wait, [ref], fetch_local=False)
            exported = time.perf_counter()
            timing = await sync.push(ref)
            ended = time.perf_counter()
            del ref
            if index == 0:
                continue
            in_actor = timing.pause_s + timing.update_s + timing.resume_s
            rows.append((ended - started, exported - started, timing.wall_s - in_actor, timing.pause_s,
                         timing.phases["copy_s"], timing.phases["load_s"], timing.phases["reset_s"],
                         timing.resume_s, sum(engine.calls.values()) - calls, timing.phases["buckets"],
                         timing.phases["shm_bytes"]))
            print(f"{label}: push {index}: {ended - started:.3f} s", flush=True)
    finally:
        await engine.shutdown()
        ray.kill(exporter)
    median = [statistics.median(column) for column in zip(*rows, strict=True)]
    return PushFigures(label, num_bytes, floor, *median[:9], int(median[9]), int(median[10]))


def render(figures: list[PushFigures], command: str, elapsed: float, bucket_bytes: int) -> str:
    lines = [
        f"`{command}` — {elapsed:.0f} s, load average {os.getloadavg()[0]:.2f} at the end; median of the pushes "
        f"after a warm-up one; buckets of whole layers up to {bucket_bytes / 2**20:.0f} MiB.",
        "",
        "| model | bytes pushed | floor (1 copy) | push wall | ratio | export | transfer (Ray) | pause | "
        "copy to shm | load (vLLM reload, overlaps copy) | cache reset + version | resume | round trips | buckets "
        "| extra memory (shm) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        ms = lambda s: f"{s * 1000:.0f} ms" if s >= 0.01 else f"{s * 1000:.1f} ms"  # noqa: E731
        lines.append(
            f"| {f.label} | {f.num_bytes / 2**20:.1f} MiB | {ms(f.floor_s)} | {ms(f.wall_s)} | {f.ratio:.1f}× | "
            f"{ms(f.export_s)} | {ms(f.transfer_s)} | {ms(f.pause_s)} | {ms(f.copy_s)} | {ms(f.load_s)} | "
            f"{ms(f.reset_s)} | {ms(f.resume_s)} | {f.round_trips:.0f} | {f.buckets} | {f.shm_bytes / 2**20:.0f} MiB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=3, help="timed pushes per model (after one warm-up push)")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="VLLMEngineConfig.weight_bucket_bytes in MiB")
    parser.add_argument("--models", default="tiny,smollm2,smollm2-bf16", help=f"any of {sorted(MODELS)}")
    parser.add_argument("--zero-copy-export", action="store_true",
                        help="the exporter serializes tensors as numpy views: the engine actor reads them in place")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    bucket_bytes = int(args.bucket_mb * 2**20)
    init_ray()
    started = time.perf_counter()
    figures = []
    for label in args.models.split(","):
        figures.append(asyncio.run(measure(label, args.pushes, bucket_bytes, args.zero_copy_export)))
    command = command_line()
    section = "## Weight push at real sizes\n\n" + render(figures, command, time.perf_counter() - started, bucket_bytes)
    report(section, BEGIN, END, write=not args.no_write)
    transfer_model.write(args.no_write)  # the same push at GPU sizes and bandwidths, modelled


if __name__ == "__main__":
    main()
