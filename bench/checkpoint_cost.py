"""What resuming the rows a checkpoint caught mid-generation costs, kept episodes versus restarting rows.

The real control code (rollouter, queue, weight sync, training loop, the checkpoint writer) drives
simulated engines and trainer on a virtual clock, with multi-turn agent episodes whose turn count
and turn lengths have a long tail (an episode of 1–12 turns, each turn's length log-normal). A
checkpoint is written every `--every` steps; for each, the rows still generating are split into
their finished episodes (kept by the checkpoint) and unfinished ones (generated again on resume).

    restart rows from scratch : regenerate every token of every running row (kept + discarded)
    keep finished episodes    : regenerate only the unfinished episodes' tokens (discarded)

Tokens of a call in progress at the checkpoint are not counted by either (both are lower bounds by
the same amount). Also reports what one checkpoint writes (bytes, seconds) for the control side.

    .venv/bin/python bench/checkpoint_cost.py [--steps 40] [--every 4]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

from fullasync.client import ClientConfig, RolloutService
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.rollouter import RolloutSettings
from fullasync.run import checkpoint as ckpt
from fullasync.run.assemble import assemble
from fullasync.run.checkpoint import CheckpointPolicy
from fullasync.run.runner import RunSettings
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer
from fullasync.sim.trainer import SimulatedTrainer, TrainCost


def turn_length(episode: str, turn: int) -> int:
    z = random.Random(f"{episode}/{turn}").gauss(0.0, 1.0)
    return max(8, min(2048, round(160 * 2.718281828 ** (0.9 * z))))


async def agent(client, row) -> float:
    """A multi-turn episode: each turn is a model call on the conversation so far (prompt grows)."""
    turns = random.Random(client.episode.id).choice([1, 2, 2, 3, 3, 4, 5, 6, 8, 12])
    context = [1] * 128
    for turn in range(turns):
        length = turn_length(client.episode.id, turn)
        await client.completions.create(model="policy", prompt=context[-1024:], max_tokens=length,
                                        extra_body={"ignore_eos": True})
        context += [2] * (length + 32)  # the output and a tool result
    return float(random.Random(client.episode.id).random() < row["p"])


async def main(root: Path, steps: int, every: int, engines: int, batch: int, n: int) -> None:
    sims = [SimulatedEngine(f"sim-{i}", DecodeCost(max_num_seqs=64)) for i in range(engines)]
    service = RolloutService(sims, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096,
                                                                resume_timeout_s=1e6))
    settings = RunSettings(max_staleness=2, batch_size=batch, total_steps=steps, queue_in_process=True,
                           rollout=RolloutSettings(n=n, max_running_rows=engines * 64 // n * 2, episode_timeout_s=1e9))
    run = await assemble(engines=sims, trainer=SimulatedTrainer(TrainCost(2e-5, 2.0), 4), service=service,
                         rollout_fn=agent, settings=settings, sink=MetricsSink(None),
                         checkpoints=CheckpointPolicy(root, every=every, keep=0))
    rows = ((f"row-{i}", {"p": random.Random(i).random()}) for i in range(10**6))
    await run.execute(rows)
    await __import__("asyncio").gather(*(e.shutdown() for e in sims))
    saved = {s.path.name: s for s in run.saved}
    print(f"{len(saved)} checkpoints of a run of {steps} steps ({engines} engines, batch {batch}×{n}, k=2)\n")
    print(f"{'step':>5} {'running rows':>12} {'kept eps':>9} {'kept tok':>9} {'discarded tok':>14} "
          f"{'scratch cost':>13} {'ours':>8} {'saved':>6} {'MB':>6} {'s':>6}")
    ratios = []
    for path in ckpt.complete_checkpoints(root):
        state = ckpt.load(path)
        r = state.rollout
        kept_episodes = sum(t is not None for eps in r.in_flight.values() for t in eps.values())
        scratch = r.kept_tokens + r.discarded_tokens
        ratio = r.discarded_tokens / scratch if scratch else 1.0
        ratios.append(ratio)
        info = saved[path.name]
        print(f"{state.loop.steps:>5} {len(r.in_flight):>12} {kept_episodes:>9} {r.kept_tokens:>9} "
              f"{r.discarded_tokens:>14} {scratch:>13} {r.discarded_tokens:>8} {1 - ratio:>6.0%} "
              f"{info.num_bytes / 2**20:>6.2f} {info.seconds:>6.3f}")
    print(f"\nkeeping finished episodes regenerates {statistics.mean(ratios):.2f}× the tokens of restarting the "
          f"running rows (mean over checkpoints; median {statistics.median(ratios):.2f}×)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_virtual(lambda: main(Path(tmp), args.steps, args.every, args.engines, args.batch, args.n))
    sys.exit(0)
