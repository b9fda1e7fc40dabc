"""Does a run learn an OpenEnv environment? `fullasync train data.task=openenv:<package>` over seeds, held-out
before and after.

Runs the real stack (vLLM engine, verl trainer, Ray, openenv's server in `.venv-openenv`: `make setup-openenv`)
once per seed with `seed=S trainer.seed=S`, on the environment openenv ships as its template (`echo_env`: the reply
echoed, reward min(0.1 × its length, 1)) unless `--task` names another, one turn per episode, and reads each run's
`result.json`: the held-out score before and after training (the environment's reward on the held-out resets,
seeds no training row has) with their standard errors over episodes. Prints each seed's gain ± SE
(sqrt(SE_before² + SE_after²)), how many are ≥ 3 SE, the mean gain ± its SE over seeds and the worst; writes one
record per seed to bench/results/openenv_learning/seed<S>.json (a seed with a record is not run again).
A benchmark, not a test: nothing is asserted. What it depends on: the starting policy (`model.path`; the default is
the built-in task's warm-up policy, whose replies already earn ~0.93 of the echo's 1.0, so the room is small),
`--steps`, and the machine's speed only through the wall time.

    .venv/bin/python bench/openenv_learning.py                      # seeds 0 1 2, 20 steps
    .venv/bin/python bench/openenv_learning.py --seeds 3 4 --steps 30 --args model.path=smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "openenv_learning"


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, object]:
    out = ROOT / "outputs" / "openenv_learning" / f"seed{seed}"
    argv = [str(Path(sys.executable).parent / "fullasync"), "train", f"data.task={args.task}", f"seed={seed}",
            f"trainer.seed={seed}", f"total_steps={args.steps}", f"output_dir={out}", "checkpoint.every=0",
            "+data.task_args={max_turns: 1}", *args.args]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "FULLASYNC_PLAIN": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: fullasync train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    return {"seed": seed, "task": args.task, "steps": result["steps"], "args": args.args,
            "before": result["val_before"], "before_se": result["val_before_stderr"],
            "after": result["val_after"], "after_se": result["val_after_stderr"],
            "episode_failures": result.get("episode_failures"), "wall_s": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--task", default="openenv:echo_env")
    parser.add_argument("--args", nargs="*", default=[], help="more `fullasync train` overrides")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in args.seeds:
        path = RESULTS / f"seed{seed}.json"
        if not path.exists():
            path.write_text(json.dumps(run_seed(seed, args), indent=1) + "\n")
        records.append(json.loads(path.read_text()))
    gains = []
    print("seed  before          after           gain ± SE         wall s")
    for r in records:
        gain, se = r["after"] - r["before"], math.hypot(r["before_se"], r["after_se"])
        gains.append((gain, se))
        print(f"{r['seed']:>4}  {r['before']:.3f} ± {r['before_se']:.3f}  {r['after']:.3f} ± {r['after_se']:.3f}  "
              f"{gain:+.3f} ± {se:.3f} ({gain / se if se else math.inf:.1f} SE)  {r['wall_s']:.0f}")
    means = [g for g, _ in gains]
    spread = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")
    print(f"mean gain {statistics.mean(means):+.3f} ± {spread:.3f} over {len(means)} seeds; "
          f"{sum(g >= 3 * se for g, se in gains)} of {len(gains)} ≥ 3 SE; worst {min(means):+.3f}")


if __name__ == "__main__":
    main()
