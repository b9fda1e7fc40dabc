"""On-policy distillation against RL alone: held-out score per trained sample and per second, over seeds.

Three arms per seed, each a real training run (vLLM engine, verl trainer, Ray; fully async, the task's defaults)
from the task's warm policy: `rl` (the task reward alone), `opd` (the teacher's per-token reverse KL alone:
`trainer.distill_task_weight=0`) and `both` (each weighted 1). Tasks: `builtin` (`fullasync train`, the built-in
arithmetic task, held-out accuracy) and `deepresearch` (`python -m examples.deepresearch.train`, held-out F1). The
teacher is a stronger policy trained by fullasync's own RL from the same warm policy — one pinned run per task
(`Task.teacher_args`), built on first use and cached by its spec under the cache root (`$FULLASYNC_CACHE_DIR`,
`models/<task>-teacher-<key>`; its build time and held-out score are in its `fullasync_build.json`), kept offline
like the examples' warm policies. It is served on an engine of its own beside the student's: on a 2-core machine the
two engines and the trainer share the cores, so the wall-clock column says what that layout gives, not what a GPU
node would.

Each run validates every `--val-every` steps and writes one record per arm and seed to
bench/results/opd_learning/<label>/<arm>_seed<S>.json (the label: the task, and `--steps` if given; a record that
exists is not run again). Prints, per arm, the
held-out score at each validation (mean ± SE over seeds) by trained samples, and per seed the samples OPD and
both took to reach the RL run's final held-out score of the same seed, as a share of RL's samples. A benchmark,
not a test: nothing is asserted. What it depends on: the teacher (its held-out score bounds what distillation can
reach), `--steps`, the seeds; the machine's speed only through the wall time.

    .venv/bin/python bench/opd_learning.py                        # builtin, seeds 0 1 2, 20 steps, the three arms
    .venv/bin/python bench/opd_learning.py --task deepresearch --seeds 0 --arms rl opd
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FULLASYNC = [str(Path(sys.executable).parent / "fullasync"), "train"]
TEACHER_FORMAT = 1  # bump when a teacher's procedure changes; part of its cache key
ARMS = {
    "rl": (),
    "opd": ("beside.teacher.role=teacher", "trainer.distill_task_weight=0"),
    "both": ("beside.teacher.role=teacher",),
}


@dataclass(frozen=True)
class Task:
    """How one task trains (`command`), its teacher (`teacher_args`: one pinned run from the task's own warm start),
    what its teacher needs beside the student (`serving`), and its trained samples per step."""

    command: tuple[str, ...]
    teacher_args: tuple[str, ...]
    serving: tuple[str, ...]
    samples_per_step: int  # rollout.batch_size × rollout.n of its defaults
    default_steps: int
    val_every: int  # its held-out evaluation every this many steps (deepresearch's takes ~30 s)
    common: tuple[str, ...] = ()  # every arm's (deepresearch: a context one token short of the model's positions, so
    # that the teacher's scoring requests, one token longer than a sequence, fit them)


TASKS = {
    "builtin": Task(tuple(FULLASYNC), ("seed=0", "trainer.seed=0", "total_steps=400", "data.epochs=80",
                                       "checkpoint.every=0", "save_checkpoint=true"),
                    ("beside.teacher.kv_cache_mb=64",), 64, 20, 2),
    "deepresearch": Task((sys.executable, "-m", "examples.deepresearch.train"),
                         ("seed=1", "trainer.seed=1", "total_steps=60", "checkpoint.every=0", "save_checkpoint=true"),
                         ("beside.teacher.max_model_len=2048", "beside.teacher.kv_cache_mb=128"), 64, 30, 10,
                         ("engine.max_model_len=2047", "agent.max_context_tokens=2047")),
}


def train(task: Task, argv: list[str], out: Path) -> dict[str, object]:
    """One training run of `task` into `out`; its result.json."""
    done = subprocess.run([*task.command, f"output_dir={out}", *argv], cwd=ROOT,
                          env={**os.environ, "FULLASYNC_PLAIN": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(task.command)} {' '.join(argv)} failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}{done.stdout[-2000:]}")
    return json.loads((out / "result.json").read_text())


def teacher_path(name: str, task: Task) -> Path:
    """The task's teacher model directory, trained first if it is not cached (its pinned `teacher_args`)."""
    from fullasync.models.cache import cached_build
    from fullasync.models.tiny import default_cache_root

    start = ""
    if name == "builtin":
        from fullasync.tasks.warmup import build_warm_policy

        start = build_warm_policy().name  # the warm policy it is trained from (its own build's key)
    key = hashlib.sha256(json.dumps([TEACHER_FORMAT, name, task.teacher_args, start]).encode()).hexdigest()[:16]

    def build_into(staging: Path) -> dict[str, object]:
        with tempfile.TemporaryDirectory(prefix="opd-teacher-") as work:
            started = time.monotonic()
            print(f"building the {name} teacher: {' '.join(task.teacher_args)} (once, cached)", flush=True)
            result = train(task, list(task.teacher_args), Path(work))
            for item in (Path(work) / "checkpoint").iterdir():
                shutil.move(str(item), staging / item.name)
            return {"task": name, "args": list(task.teacher_args), "from": start,
                    "build_s": round(time.monotonic() - started, 1), "val_before": result["val_before"],
                    "val_after": result["val_after"], "val_after_stderr": result["val_after_stderr"]}

    return cached_build(default_cache_root() / "models" / f"{name}-teacher-{key}", build_into)


@dataclass(frozen=True)
class Study:
    """Arms compared on a task over seeds: each arm's `fullasync train` overrides, the arm the others are measured
    against (`baseline`), where its records go (bench/results/<name>/...)."""

    name: str
    arms: dict[str, tuple[str, ...]]
    baseline: str
    tasks: tuple[str, ...] = tuple(TASKS)  # those it can run on, the first by default

    def uses_teacher(self, arm: str) -> bool:
        return any(override.startswith("beside.teacher.") for override in self.arms[arm])


OPD = Study("opd_learning", ARMS, "rl")


def run_arm(study: Study, name: str, arm: str, seed: int, args: argparse.Namespace,
            teacher: Path | None) -> dict[str, object]:
    task = TASKS[name]
    out = ROOT / "outputs" / study.name / args.label / f"{arm}_seed{seed}"
    served = [f"beside.teacher.path={teacher}", *task.serving] if study.uses_teacher(arm) else []
    argv = [f"seed={seed}", f"trainer.seed={seed}", f"total_steps={args.steps or task.default_steps}",
            f"val_every={args.val_every or task.val_every}", "checkpoint.every=0", *task.common, *served,
            *study.arms[arm], *args.args]
    started = time.monotonic()
    train(task, argv, out)
    return read_record(out, name, arm, seed, argv, time.monotonic() - started)


def read_record(out: Path, name: str, arm: str, seed: int, argv: list[str], wall_s: float) -> dict[str, object]:
    """The record of the run in `out`: its held-out score at each validation, by trained samples and seconds."""
    task, result = TASKS[name], json.loads((out / "result.json").read_text())
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = {int(step["step"]): step["perf/elapsed_s"] for step in steps}
    validations = {int(v["step"]): v for v in map(json.loads, (out / "validation.jsonl").read_text().splitlines())}
    curve = [(step, elapsed.get(step, 0.0), v["score"], v.get("stderr", 0.0))
             for step, v in sorted(validations.items())]
    return {"task": name, "arm": arm, "seed": seed, "args": argv, "steps": result["steps"],
            "before": result["val_before"], "after": result["val_after"], "after_se": result["val_after_stderr"],
            "curve": [{"step": s, "samples": s * task.samples_per_step, "elapsed_s": round(t, 1), "accuracy": a,
                       "stderr": se} for s, t, a, se in curve],
            "teacher_kl": [step.get("teacher/kl") for step in steps],
            "episode_failures": result.get("episode_failures"), "wall_s": round(wall_s, 1)}


def samples_to_reach(record: dict, target: float) -> int | None:
    """Trained samples at the first validation whose held-out accuracy reaches `target` (None: never)."""
    return next((point["samples"] for point in record["curve"] if point["accuracy"] >= target), None)


def report(records: dict[tuple[str, int], dict], arms: list[str], seeds: list[int], baseline: str = "rl") -> None:
    for arm in arms:
        runs = [records[(arm, seed)] for seed in seeds if (arm, seed) in records]
        if not runs:
            continue
        print(f"\n{arm}: held-out accuracy by trained samples (mean ± SE over {len(runs)} seeds; wall s mean)")
        for points in zip(*(run["curve"] for run in runs), strict=False):
            accuracy = [point["accuracy"] for point in points]
            se = statistics.stdev(accuracy) / math.sqrt(len(accuracy)) if len(accuracy) > 1 else float("nan")
            print(f"  {points[0]['samples']:>6}  {statistics.mean(accuracy):.3f} ± {se:.3f}  "
                  f"{statistics.mean(point['elapsed_s'] for point in points):>6.0f}")
    print(f"\nper seed: samples to reach {baseline}'s final held-out accuracy, as a share of {baseline}'s samples")
    for seed in seeds:
        base = records.get((baseline, seed))
        if base is None:
            continue
        target, total = base["after"], base["curve"][-1]["samples"]
        shares = []
        for arm in (a for a in arms if a != baseline and (a, seed) in records):
            reached = samples_to_reach(records[(arm, seed)], target)
            shares.append(f"{arm} {reached / total:.0%}" if reached is not None else f"{arm} never")
        print(f"  seed {seed}: {baseline} final {target:.3f} at {total} samples; {', '.join(shares)}")


def main(study: Study = OPD, doc: str | None = __doc__) -> None:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(study.arms), choices=list(study.arms))
    parser.add_argument("--task", choices=list(study.tasks), default=study.tasks[0])
    parser.add_argument("--steps", type=int, default=0, help="train steps per run (0: the task's default)")
    parser.add_argument("--val-every", type=int, default=0, help="validate every this many steps (0: the task's)")
    parser.add_argument("--label", default="", help="the records' folder (default: the task, and the steps if given)")
    parser.add_argument("--args", nargs="*", default=[], help="more `fullasync train` overrides, for every arm")
    args = parser.parse_args()
    args.label = args.label or (args.task if not args.steps else f"{args.task}-{args.steps}steps")
    results = ROOT / "bench" / "results" / study.name / args.label
    results.mkdir(parents=True, exist_ok=True)
    teacher = None
    if any(study.uses_teacher(arm) for arm in args.arms):
        teacher = teacher_path(args.task, TASKS[args.task])
        print(f"teacher: {teacher} ({json.loads((teacher / 'fullasync_build.json').read_text())})", flush=True)
    records = {}
    for seed in args.seeds:
        for arm in args.arms:
            path = results / f"{arm}_seed{seed}.json"
            if not path.exists():
                path.write_text(json.dumps(run_arm(study, args.task, arm, seed, args, teacher), indent=1) + "\n")
            records[(arm, seed)] = json.loads(path.read_text())
            print(f"{arm} seed {seed}: {records[(arm, seed)]['before']:.3f} → {records[(arm, seed)]['after']:.3f} "
                  f"({records[(arm, seed)]['wall_s']:.0f} s)", flush=True)
    report(records, args.arms, args.seeds, study.baseline)


if __name__ == "__main__":
    main()
