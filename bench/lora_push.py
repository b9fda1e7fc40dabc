"""LoRA: push the adapter or the merged weights? SmolLM2-135M-Instruct, fp32, on this CPU, one run.

What each choice costs per training step:
- merged (the default): the trainer merges W + alpha/r · B·A for every adapted layer (`merge_lora`), then pushes the
  full weights as any full fine-tuning run does (its cost: bench/weight_push.py, `docs/benchmarks/weight-push.md`);
  the engines serve plain weights at plain speed;
- adapter: only A and B travel (vLLM loads them as a LoRA adapter, a new adapter id per version), but every token
  the engines generate then goes through vLLM's LoRA kernels (`enable_lora`, punica's CPU ops here).

Measured here, each engine in its own process (vLLM's offline `LLM`, the same model and prompts, greedy, 16
sequences × 96 tokens, best of 3): the bytes of each payload, the merge on one process, an adapter load into a
running engine (`add_lora`, a new id each time), and generation tokens/s of a plain engine, of a LoRA-enabled engine
without and with the adapter. Printed as ratios with the per-step model for a step that generates G tokens per
engine: merged = merge + full push; adapter = adapter load + G × (1/lora_tps − 1/plain_tps).

    .venv/bin/python bench/lora_push.py [--rank 8] [--tokens 96]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = "lora_push result: "  # the line an engine run prints its figures on (vLLM prints to stdout too)
PROMPTS = [f"Write a short story about a {thing}." for thing in (
    "lighthouse", "robot", "garden", "river", "mountain", "library", "train", "storm",
    "violin", "desert", "harbour", "clock", "forest", "bridge", "comet", "market")]


def make_adapter(model_path: str, rank: int, out: Path) -> dict[str, float]:
    """A peft adapter on every linear layer, B drawn non-zero (a trained adapter's shape and cost), saved to
    `out`; returns its bytes, the full model's bytes and the merge time (best of 3)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    from fullasync.trainer.lora import merge_lora

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    full_bytes = sum(t.numel() * t.element_size() for t in base.state_dict().values())
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.01)
    model.save_pretrained(out)
    adapter_bytes = sum(t.numel() * t.element_size() for name, t in model.state_dict().items() if "lora_" in name)
    state = {name: t.detach() for name, t in model.state_dict().items()}
    scalings = {name: layer.scaling["default"] for name, layer in model.named_modules() if isinstance(layer, LoraLayer)}
    merges = []
    for _ in range(3):
        began = time.perf_counter()
        merge_lora(state, scalings)
        merges.append(time.perf_counter() - began)
    return {"adapter_bytes": adapter_bytes, "full_bytes": full_bytes, "merge_s": min(merges)}


def engine_run(model_path: str, adapter: str, rank: int, kind: str, tokens: int) -> dict[str, float]:
    """In this process: one engine of `kind` (plain, lora_base, lora) generating; best of 3 tokens/s, and for
    LoRA engines the time of loading the adapter under a new id (3 times)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    lora = kind != "plain"
    llm = LLM(model=model_path, dtype="float32", max_model_len=512, max_num_seqs=16, seed=0, enforce_eager=True,
              kv_cache_memory_bytes=128 * 2**20, enable_lora=lora, max_lora_rank=max(rank, 8), max_loras=1)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    loads = []
    if lora:
        for lora_id in (1, 2, 3):
            began = time.perf_counter()
            llm.llm_engine.add_lora(LoRARequest(f"v{lora_id}", lora_id, adapter))
            loads.append(time.perf_counter() - began)
            if lora_id < 3:
                llm.llm_engine.remove_lora(lora_id)
    request = LoRARequest("v3", 3, adapter) if kind == "lora" else None
    llm.generate(PROMPTS[:2], params, lora_request=request, use_tqdm=False)  # warm-up
    rates = []
    for _ in range(3):
        began = time.perf_counter()
        outputs = llm.generate(PROMPTS, params, lora_request=request, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - began))
    return {"tokens_per_s": max(rates), "load_s": statistics.median(loads) if loads else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--push-ms", type=float, default=1338.0,
                        help="a full push of SmolLM2 fp32 (docs/benchmarks/weight-push.md, bench/weight_push.py)")
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # internal: run one engine in this process
    parser.add_argument("--adapter", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from fullasync.models import build_pretrained_model

    model_path = str(build_pretrained_model("smollm2-135m-instruct"))
    if args.engine:
        figures = engine_run(model_path, args.adapter, args.rank, args.engine, args.tokens)
        print(RESULT + json.dumps(figures), flush=True)
        return
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        sizes = make_adapter(model_path, args.rank, Path(folder))
        engines = {}
        for kind in ("plain", "lora_base", "lora"):
            done = subprocess.run([sys.executable, __file__, "--engine", kind, "--adapter", folder, "--rank",
                                   str(args.rank), "--tokens", str(args.tokens)], cwd=ROOT, capture_output=True,
                                  text=True)
            results = [line[len(RESULT):] for line in done.stdout.splitlines() if line.startswith(RESULT)]
            if done.returncode or not results:
                raise RuntimeError(f"the {kind} engine run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            engines[kind] = json.loads(results[-1])
            print(f"[lora_push] {kind}: {engines[kind]}", flush=True)
    plain, base, lora = (engines[k]["tokens_per_s"] for k in ("plain", "lora_base", "lora"))
    merged_s = sizes["merge_s"] + args.push_ms / 1000
    slowdown_s_per_token = 1 / lora - 1 / plain
    break_even = (merged_s - engines["lora"]["load_s"]) / slowdown_s_per_token if slowdown_s_per_token > 0 else 0
    print(f"\nSmolLM2-135M fp32, LoRA rank {args.rank} on every linear layer ({time.perf_counter() - began:.0f} s)")
    print("| payload | bytes | per push (trainer → engine) |\n|---|---|---|")
    print(f"| merged weights | {sizes['full_bytes'] / 2**20:.1f} MiB | merge {sizes['merge_s'] * 1000:.0f} ms + full "
          f"push {args.push_ms:.0f} ms |")
    print(f"| adapter | {sizes['adapter_bytes'] / 2**20:.2f} MiB ({sizes['adapter_bytes'] / sizes['full_bytes']:.1%}) "
          f"| add_lora {engines['lora']['load_s'] * 1000:.0f} ms (from disk) |")
    print(f"\n| engine | generation tokens/s (16 × {args.tokens}, greedy) | × plain |\n|---|---|---|")
    for name, rate in (("plain weights (merged push)", plain), ("enable_lora, no adapter", base),
                       ("enable_lora, serving the adapter", lora)):
        print(f"| {name} | {rate:.0f} | {rate / plain:.2f}× |")
    print(f"\nper step: merged costs {merged_s:.2f} s once; the adapter costs {engines['lora']['load_s']:.2f} s plus "
          f"{slowdown_s_per_token * 1000:.2f} ms per generated token and engine; the adapter wins below "
          f"{break_even:,.0f} generated tokens per engine per step.")


if __name__ == "__main__":
    main()
