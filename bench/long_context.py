"""The trainer's memory and time on one long sequence: the path before long-context training, packed attention,
log-probs in chunks, and sequence parallelism, at growing lengths.

For each model and each path, one `VerlTrainer` (verl FSDP2 on CPU, fp32, full fine-tuning, activations recomputed
in the backward pass as any long-context training does: without, SmolLM2 holds ~1.6 MB of activations per token,
50 GB at 32k) trains one step on a
sequence of L tokens (half prompt, half response; every response token trained with advantage 1) at each length,
shortest first, after a warm-up step at the shortest. Reported per (path, L): the peak resident memory of the
busiest rank during the step (`peak_memory_gb`: VmHWM, reset at the step's start) and the seconds per 1k tokens.
Then a linear fit of peak memory against L per path (bytes per token), and the share of it that is the logits
(the full-logits path's slope minus the chunked path's).

Paths:
- before: what the trainer ran before (padded rows through transformers' SDPA, full [L, vocab] logits in fp32);
- packed: padding-free rows through the causal SDPA per packed sequence (`attention.PACKED_SDPA`), full logits;
- chunked: packed + `chunked_logprobs` (512 positions at a time, forward and backward);
- chunked SP=k: chunked with `sequence_parallel_size=k` over k ranks (Ulysses; k divides the model's heads:
  2 for the tiny model, 3 for SmolLM2's 9).
Micro-batches by tokens (`max_tokens_per_micro_batch` = L) in every path but `before`.

A full-logits path is skipped at a length where its logits alone would pass `--logits-cap-gb` (the machine has 24 GB;
its fp32 logits, their softmax and gradient take about four copies of [L, vocab]); a step whose rank Ray kills for
memory is reported as "out of memory", and that path's longer lengths with it.

    .venv/bin/python bench/long_context.py [--models tiny smollm2-135m-instruct] [--lengths 2048 8192 16384 32768]
        [--tiny-lengths ... 65536] [--no-write]

Writes a table into docs/benchmarks/long-context.md and a plot into docs/benchmarks/long_context.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from _report import STUDIES, report, run_note

from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

BEGIN, END = "<!-- long-context:begin -->", "<!-- long-context:end -->"
LOGITS_COPIES = 4  # fp32 logits, log-softmax, softmax in the backward, their gradient


@dataclass(frozen=True)
class Path_:
    name: str
    settings: dict[str, object]
    full_logits: bool
    ranks: int = 1


def paths(parallel: int) -> list[Path_]:
    return [
        Path_("before", {"padding_free": "off"}, True),
        Path_("packed", {"padding_free": "on"}, True),
        Path_("chunked", {"padding_free": "on", "chunked_logprobs": True}, False),
        Path_(f"chunked SP={parallel}", {"chunked_logprobs": True, "num_workers": parallel,
                                          "sequence_parallel_size": parallel}, False, parallel),
    ]


def one_sequence(length: int, seed: int) -> list[TrajectoryGroup]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(100, 1000, (length,), generator=generator).tolist()
    prompt, output = tokens[: length // 2], tokens[length // 2:]
    call = ModelCall(tuple(prompt), tuple(output), (-2.0,) * len(output), (0,) * len(output), FinishReason.LENGTH)
    return [TrajectoryGroup(f"long-{length}", (Trajectory((call,), reward=1.0),))]


async def measure(model_path: str, path: Path_, lengths: list[int], vocab: int, cap_gb: float,
                  ) -> dict[int, dict[str, float] | str]:
    """{L: {peak_gb, s_per_1k}} for each length this path runs, or the reason it was skipped."""
    results: dict[int, dict[str, float] | str] = {}
    runnable = [n for n in lengths if not path.full_logits or n * vocab * 4 * LOGITS_COPIES / 2**30 <= cap_gb]
    for n in lengths:
        if n not in runnable:
            results[n] = f"skipped: full logits ~{n * vocab * 4 * LOGITS_COPIES / 2**30:.0f} GB"
    if not runnable:
        return results
    settings = dict(path.settings, gradient_checkpointing=True)
    if path.name != "before":
        settings["max_tokens_per_micro_batch"] = max(runnable)
    config = TrainerConfig(lr=1e-6, micro_batch_size=1, call_timeout_s=7200, worker_num_cpus=2 / path.ranks,
                           **settings)  # type: ignore[arg-type]
    trainer = VerlTrainer(model_path, config)
    await trainer.start()
    try:
        for step, n in enumerate([runnable[0], *runnable]):
            batch = trainer.build_batch(one_sequence(n, step))
            batch = dataclasses.replace(batch, advantages=batch.response_mask.float())  # every response token
            started = time.perf_counter()
            try:
                metrics = await trainer.train_step(batch, trainer_version=0)
            except Exception as error:  # a rank killed for memory (Ray's OOM killer) is a result
                reason = "out of memory" if "memory" in str(error).lower() else type(error).__name__
                print(f"  {path.name:>14} L={n:>6}: {reason}", flush=True)
                results.update({m: reason for m in runnable if m >= n})
                break
            seconds = time.perf_counter() - started
            if step:  # the first is the warm-up
                results[n] = {"peak_gb": metrics["peak_memory_gb"], "s_per_1k": seconds / (n / 1000)}
                print(f"  {path.name:>14} L={n:>6}: peak {metrics['peak_memory_gb']:.2f} GB, "
                      f"{seconds / (n / 1000):.2f} s per 1k tokens", flush=True)
    finally:
        with contextlib.suppress(Exception):  # a trainer whose rank died may not shut down cleanly
            await trainer.shutdown()
    return results


def slope(points: dict[int, dict[str, float] | str]) -> float | None:
    """Least-squares bytes per token of peak memory against length (None with fewer than two lengths)."""
    measured = [(n, v["peak_gb"] * 2**30) for n, v in points.items() if isinstance(v, dict)]
    if len(measured) < 2:
        return None
    xs, ys = torch.tensor([float(n) for n, _ in measured]), torch.tensor([y for _, y in measured])
    return float(((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum())


def render(tables: dict[str, dict[str, dict[int, dict[str, float] | str]]], vocabularies: dict[str, int],
           note: str) -> str:
    lines = ["## Long sequences in the trainer", "",
             "One train step on one sequence of L tokens (half prompt, half trained response), verl FSDP2 on this "
             "machine's CPU, fp32, activations recomputed in the backward pass; peak resident memory of the "
             "busiest rank during the step and seconds per 1k tokens, per path (see `bench/long_context.py`: "
             "before = padded SDPA + full logits, the path before this work; packed = causal SDPA per packed "
             "sequence; chunked = packed + log-probs 512 positions at a time; SP = sequence parallel over that many "
             "ranks). Slope: least squares of peak memory on L.", "",
             note, ""]
    for model, table in tables.items():
        lengths = sorted({n for points in table.values() for n in points})
        lines += [f"### {model} (vocabulary {vocabularies[model]:,})", "",
                  "| path | " + " | ".join(f"L={n:,}" for n in lengths) + " | slope (bytes/token) |",
                  "|---|" + "---|" * len(lengths) + "---|"]
        for name, points in table.items():
            cells = []
            for n in lengths:
                value = points.get(n)
                cells.append(value if isinstance(value, str) else
                             f"{value['peak_gb']:.2f} GB, {value['s_per_1k']:.3g} s/1k" if value else "—")
            fitted = slope(points)
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {fitted / 1e3:,.0f} k |" if fitted is not None
                         else f"| {name} | " + " | ".join(cells) + " | — |")
        full, chunked = slope(table.get("packed", {})), slope(table.get("chunked", {}))
        if full is not None and chunked is not None:
            lines += ["", f"Logits: {full / 1e3:,.0f} k − {chunked / 1e3:,.0f} k = {(full - chunked) / 1e3:,.0f} k "
                      f"bytes per token of the packed path's slope ({(full - chunked) / full:.0%}) are the full "
                      f"logits (fp32 [L, {vocabularies[model]:,}] is {4 * vocabularies[model] / 1e3:,.0f} k bytes "
                      "per token per copy)."]
        lines.append("")
    lines.append("![peak memory against sequence length](long_context.png)")
    return "\n".join(lines)


def plot(tables: dict[str, dict[str, dict[int, dict[str, float] | str]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 4), squeeze=False)
    for axis, (model, table) in zip(axes[0], tables.items(), strict=True):
        for name, points in table.items():
            measured = sorted((n, v["peak_gb"]) for n, v in points.items() if isinstance(v, dict))
            if measured:
                axis.plot([n for n, _ in measured], [gb for _, gb in measured], "o-", label=name)
        axis.set_title(model)
        axis.set_xlabel("tokens in the sequence")
        axis.set_ylabel("peak memory per rank (GB)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


async def main(args: argparse.Namespace) -> None:
    from transformers import AutoConfig

    from fullasync.infra.runtime import init_ray

    started = time.perf_counter()
    init_ray(num_cpus=2, log_to_driver=False)
    tables: dict[str, dict[str, dict[int, dict[str, float] | str]]] = {}
    vocabularies: dict[str, int] = {}
    for model in args.models:
        if model == "tiny":
            from fullasync.models.tiny import build_tiny_model
            model_path, lengths = str(build_tiny_model()), args.tiny_lengths
        else:
            from fullasync.models import build_pretrained_model
            model_path, lengths = str(build_pretrained_model(model)), args.lengths
        hf_config = AutoConfig.from_pretrained(model_path)
        vocabularies[model] = hf_config.vocab_size
        heads = hf_config.num_attention_heads
        parallel = next(k for k in range(2, heads + 1) if heads % k == 0)
        print(f"{model}: vocabulary {hf_config.vocab_size}, {heads} heads (SP={parallel})", flush=True)
        tables[model] = {}
        for path in paths(parallel):
            if args.paths and path.name.split()[0] not in args.paths:
                continue
            runs = sorted(n for n in lengths if path.ranks == 1 or model == "tiny" or n <= args.sp_max_length)
            tables[model][path.name] = await measure(model_path, path, runs, hf_config.vocab_size,
                                                     args.logits_cap_gb)
    if not args.no_write:
        plot(tables, STUDIES / "long_context.png")
    report(render(tables, vocabularies, run_note(started)), BEGIN, END, not args.no_write)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m-instruct"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 8192, 16384, 32768])
    parser.add_argument("--tiny-lengths", nargs="+", type=int, default=[2048, 8192, 16384, 32768, 65536])
    parser.add_argument("--paths", nargs="*", default=[], help="only these (before, packed, chunked)")
    parser.add_argument("--logits-cap-gb", type=float, default=12.0)
    parser.add_argument("--sp-max-length", type=int, default=16384,
                        help="the longest sequence the SP path of a real model runs (its 32k step takes ~20 min here)")
    parser.add_argument("--no-write", action="store_true")
    asyncio.run(main(parser.parse_args()))
