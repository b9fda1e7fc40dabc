"""The chaos soak's short form (`bench/chaos.py`; its 30-minute form is a benchmark): three minutes of the built-in
task on the real stack, its harness speaking to the gateway through the openai SDK, while engines are killed, a push
is broken half-way, a trainer rank is killed, SIGTERM stops the run (resumed at once), and harnesses crash, hang, time
out and retry, or hang up mid-stream; every check of the soak must hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.extended]  # `make test-soak`, `make test-extended`

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def test_a_short_chaos_soak_survives_every_fault_and_passes_every_check(tmp_path):
    out = tmp_path / "chaos"
    # the run faults come in rounds of every kind (a kind whose component is restarting stays due), one every ~20 s:
    # each kind within the first ~90 s, whatever the machine's load
    done = subprocess.run([sys.executable, str(BENCH), "--minutes", "3", "--period", "20", "--seed", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    report = json.loads((out / "chaos.json").read_text())
    print("\n".join(done.stdout.strip().splitlines()[-10:]))
    assert all(report["checks"].values()), report["checks"]
    assert report["runs"] >= 2 and report["faults"].get("sigterm_resume", 0) >= 1  # a stop and a resume
    assert {"engine_kill", "trainer_rank_kill", "push_broken_halfway"} <= set(report["faults"]), report["faults"]
    assert report["fault_kinds"] >= 6 and report["steps"] > 0
    assert report["trainer_restarts"] >= 1 and report["engine_restarts"] >= 1
