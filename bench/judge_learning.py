"""Training by a judge against training by the reward it stands in for: held-out F1 per trained sample, over seeds.

Two arms per seed on the deepresearch example, each a real training run (vLLM engine, verl trainer, Ray; fully
async, the example's defaults) from its warm policy: `f1` (the example's reward, token F1 of the boxed answer) and
`judged` (`data.reward_fn=examples.deepresearch.judge:judged`: each training episode's boxed answer scored by a
judge the run serves beside the policy, `beside.judge.path=<judge>`, on an engine of its own). Held-out evaluation is
F1 in both. The judge is a tiny model warmed up offline to score an answer against the reference
(`examples/deepresearch/judge.py`; built on first use and cached by its spec, its build time and held-out agreement
with F1 in its `judge.json`). Runner, records and the printed tables as bench/opd_learning.py's (the same runs: its
`deepresearch` task, so the `f1` arm is the command of its `rl` arm): bench/results/judge_learning/<label>/
<arm>_seed<S>.json, a record that exists is not run again. A benchmark, not a test: nothing is asserted. What it
depends on: how well the judge agrees with F1 (a judge that disagrees trains the policy towards its mistakes), the
seeds, `--steps`; the machine's speed only through the wall time (the judge's engine shares the cores).

    .venv/bin/python bench/judge_learning.py                 # seeds 0 1 2, 30 steps
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opd_learning import ROOT, Study, main

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from examples.deepresearch.judge import build_judge

    if {"-h", "--help"} & set(sys.argv[1:]):  # usage only: the judge (minutes to build on an empty cache) waits
        judge = "<the judge>"
    else:
        judge = str(build_judge())
        print(f"judge: {judge} ({json.loads((Path(judge) / 'judge.json').read_text())})", flush=True)
    main(Study("judge_learning", {"f1": (), "judged": (f"beside.judge.path={judge}", "beside.judge.max_model_len=256",
                                                       "beside.judge.kv_cache_mb=32",
                                                       "data.reward_fn=examples.deepresearch.judge:judged")}, "f1",
               ("deepresearch",)),
         __doc__)
