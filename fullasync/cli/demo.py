"""`make run`: the client generating through a real vLLM engine across live weight pushes.

Starts a loopback Ray, builds the tiny local model, launches one vLLM engine, runs concurrent
chat episodes with long generations and pushes new weights twice while they run. Each episode's
response arrives whole; its recorded tokens show which weight version sampled them.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from transformers import AutoModelForCausalLM

from fullasync.client import RolloutService
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.infra.runtime import init_ray
from fullasync.models import build_tiny_model, load_tokenizer
from fullasync.weights.sync import WeightSync


def version_runs(versions: tuple[int, ...]) -> str:
    runs: list[list[int]] = []
    for version in versions:
        if runs and runs[-1][0] == version:
            runs[-1][1] += 1
        else:
            runs.append([version, 1])
    return " ".join(f"v{v}×{n}" for v, n in runs)


async def run(num_episodes: int, max_tokens: int, num_pushes: int) -> None:
    started = time.perf_counter()
    model_path = str(build_tiny_model())
    print(f"[demo] tiny model at {model_path}", flush=True)
    init_ray()
    engines = await launch_vllm_engines(VLLMEngineConfig(model_path=model_path))
    print(f"[demo] vLLM engine up after {time.perf_counter() - started:.1f} s", flush=True)
    service = RolloutService(engines, load_tokenizer(model_path))
    weight_sync = WeightSync(engines)
    weights = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()

    warm = service.client("warm-up")  # the first request of a fresh engine is slow; keep it out of the show
    await warm.completions.create(model="policy", prompt="warm up", max_tokens=4)
    clients = [service.client(f"episode-{i}") for i in range(num_episodes)]
    episodes = [
        asyncio.create_task(
            c.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": f"Episode {i}: count to one hundred."}],
                max_tokens=max_tokens,
                extra_body={"ignore_eos": True},
            )
        )
        for i, c in enumerate(clients)
    ]
    for push in range(num_pushes):
        await asyncio.sleep(0.3)
        generator = torch.Generator().manual_seed(push)
        weights = {k: v + 0.01 * torch.randn(v.shape, generator=generator) for k, v in weights.items()}
        timing = await weight_sync.push(weights)
        print(f"[demo] pushed weights v{timing.version} in {timing.total_s * 1000:.0f} ms "
              f"(pause {timing.pause_s * 1000:.0f}, update {timing.update_s * 1000:.0f})", flush=True)
    await asyncio.gather(*episodes)
    for client in clients:
        (call,) = client.episode.calls
        print(f"[demo] {client.episode.id}: {len(call.output_ids)} tokens, resumed {call.num_resumes}×, "
              f"versions {version_runs(call.output_versions)}")
    print(f"[demo] done in {time.perf_counter() - started:.1f} s")
    for engine in engines:
        await engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4, help="concurrent episodes")
    parser.add_argument("--max-tokens", type=int, default=300, help="tokens per episode")
    parser.add_argument("--pushes", type=int, default=2, help="weight pushes while the episodes run")
    args = parser.parse_args()
    asyncio.run(run(args.episodes, args.max_tokens, args.pushes))


if __name__ == "__main__":
    main()
