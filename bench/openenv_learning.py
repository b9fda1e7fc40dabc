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
from pathlib import Path

from _report import print_seed_gains, train_seed  # bench/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "openenv_learning"


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, object]:
    out = ROOT / "outputs" / "openenv_learning" / f"seed{seed}"
    argv = [f"data.task={args.task}", f"seed={seed}", f"trainer.seed={seed}", f"total_steps={args.steps}",
            f"output_dir={out}", "checkpoint.every=0", "+data.task_args={max_turns: 1}", *args.args]
    return {"task": args.task, "args": args.args, **train_seed(seed, argv, out)}


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
    print_seed_gains(records)

if __name__ == "__main__":
    main()
