"""What a step taken in two parts costs the real trainer (`bind_late`): the same batch trained whole, or as a
first part and the last groups taken when the trainer reaches them (`VerlTrainer.train_step(..., late=...)`).

SmolLM2-135M-Instruct (fp32, verl FSDP2 on CPU, one rank) or the tiny model; B groups of n trajectories, prompts of
P tokens and responses of R tokens; the late part is the last `--late` groups (a last-chance step holds as many
places as rows that only its batch can train, at most half). Whole and in parts alternate, `--repeats` times each,
in one process on one trainer; printed: the median step time of each and their ratio. Both make one update over
the same tokens; the parts add one more call into the ranks, a second proximal forward and the gradient rescale.

    .venv/bin/python bench/step_parts.py [--model smollm2-135m-instruct|tiny] [--groups 8] [--late 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup


def groups_of(count: int, n: int, prompt: int, response: int, seed: int = 0) -> list[TrajectoryGroup]:
    rng = random.Random(seed)

    def trajectory() -> Trajectory:
        call = ModelCall(tuple(rng.randrange(100, 1000) for _ in range(prompt)),
                         tuple(rng.randrange(100, 1000) for _ in range(response)), (-2.0,) * response,
                         (0,) * response, FinishReason.LENGTH)
        return Trajectory((call,), reward=float(rng.random() < 0.5))

    return [TrajectoryGroup(f"row-{g}", tuple(trajectory() for _ in range(n))) for g in range(count)]


async def main(args: argparse.Namespace) -> None:
    from fullasync.infra.runtime import init_ray

    if args.model == "tiny":
        from fullasync.models.tiny import build_tiny_model
        model_path = str(build_tiny_model())
    else:
        from fullasync.models import build_pretrained_model
        model_path = str(build_pretrained_model(args.model))
    init_ray(num_cpus=2, log_to_driver=False)
    trainer = VerlTrainer(model_path, TrainerConfig(lr=1e-6, micro_batch_size=args.micro_batch_size,
                                                    call_timeout_s=1200))
    await trainer.start()
    groups = groups_of(args.groups, args.n, args.prompt, args.response)
    whole_s: list[float] = []
    parts_s: list[float] = []
    try:
        await trainer.train_step(trainer.build_batch(groups), 1)  # warm-up
        for _ in range(args.repeats):
            started = time.perf_counter()
            await trainer.train_step(trainer.build_batch(groups), 1)
            whole_s.append(time.perf_counter() - started)
            started = time.perf_counter()

            async def rest():
                return trainer.build_batch(groups[-args.late:])

            await trainer.train_step(trainer.build_batch(groups[: -args.late]), 1, late=rest)
            parts_s.append(time.perf_counter() - started)
    finally:
        await trainer.shutdown()
    whole, parts = statistics.median(whole_s), statistics.median(parts_s)
    print(f"model {args.model}; {args.groups} groups x {args.n}, P={args.prompt} R={args.response}, "
          f"micro-batch {args.micro_batch_size}, late part {args.late} groups; {args.repeats} alternating repeats")
    print(f"whole    median {whole:.2f} s  ({', '.join(f'{s:.2f}' for s in whole_s)})")
    print(f"in parts median {parts:.2f} s  ({', '.join(f'{s:.2f}' for s in parts_s)})")
    print(f"in parts / whole = {parts / whole:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--late", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
