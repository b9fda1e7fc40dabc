"""A curriculum against uniform sampling: held-out score per trained sample and per second, over seeds.

Two arms per seed, each a real training run (vLLM engine, verl trainer, Ray; fully async, the task's defaults) from
the task's warm policy: `uniform` (rows in dataset order, `data.epochs` times: the default) and `curriculum`
(`data.curriculum=pass_rate`: rows drawn by pools of their recent pass rate — unseen and learning rows at weight 1,
solved and unsolved ones at 0.2, a floor of 0.02 — the defaults). Every drawn row is trained (no gate), so both arms
train the same samples per step and the comparison is per sample and per second alike. Tasks and records as
bench/opd_learning.py's (its runner): bench/results/curriculum_learning/<label>/<arm>_seed<S>.json, a record that
exists is not run again. Prints, per arm, the held-out score at each validation (mean ± SE over seeds) by trained
samples, and per seed the samples the curriculum took to reach the uniform run's final score. A benchmark, not a
test: nothing is asserted. What it depends on: how many rows the run draws again (the built-in task's 44 training
rows are each drawn ~4 times in 20 steps; a row drawn once is always `unseen`, so on a task whose rows are drawn
once the arms sample alike), the seeds, `--steps`.

    .venv/bin/python bench/curriculum_learning.py                     # builtin, seeds 0 1 2, 20 steps
    .venv/bin/python bench/curriculum_learning.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

from opd_learning import Study, main

CURRICULUM = Study("curriculum_learning", {"uniform": (), "curriculum": ("data.curriculum=pass_rate",)}, "uniform")

if __name__ == "__main__":
    main(CURRICULUM, __doc__)
