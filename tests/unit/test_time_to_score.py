"""What bench/time_to_score.py's table rests on: where a score curve reaches a target, over seeds."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import time_to_score


def run(points: list[tuple[int, float, float]]) -> dict:
    return {"points": [{"step": step, "wall_s": wall, "score": score, "se": 0.0} for step, wall, score in points]}


def test_a_curve_reaches_a_target_between_saved_policies_linearly_or_never():
    points = run([(0, 0.0, 0.2), (4, 20.0, 0.4), (8, 40.0, 0.8)])["points"]
    assert time_to_score.time_to(0.6, points) == 30.0
    assert time_to_score.time_to(0.2, points) == 0.0
    assert math.isnan(time_to_score.time_to(0.9, points))


def test_targets_come_from_sync_and_the_mean_curve_averages_seeds_per_saved_step():
    sync = [run([(0, 0.0, 0.2), (4, 10.0, 0.6), (8, 20.0, 0.7), (12, 30.0, 0.7)]),
            run([(0, 0.0, 0.2), (4, 14.0, 0.4), (8, 26.0, 0.6), (12, 38.0, 0.7)])]
    start, target, partway = time_to_score.targets({"sync": sync})
    assert (start, round(target, 6), round(partway, 6)) == (0.2, 0.675, 0.58)
    assert time_to_score.curve(sync)[1][1:4:2] == (12.0, 0.5)  # step 4: mean wall 12 s, mean score 0.5
    # the mean curve: 0.5 at 12 s, 0.65 at 23 s → 0.58 at 12 + 11 × 0.08 / 0.15 s
    assert math.isclose(time_to_score.mean_curve_time(0.58, sync), 12 + 11 * 0.08 / 0.15)


def test_a_run_gets_its_modes_settings_its_layout_and_the_runs_common_ones_as_dotted_names():
    from argparse import Namespace

    args = Namespace(mode="fully_async+partial", seed=3, steps=30, lr=5e-4, batch=8, every=3, out="out/x")
    settings = time_to_score.run_settings(args)
    assert settings["engine.cpus"] == "0" and settings["trainer.cpus"] == "1"  # split: a core each
    assert (settings["mode"], settings["max_staleness"], settings["partial_rollout"]) == ("fully_async", 4, True)
    assert (settings["seed"], settings["trainer.seed"], settings["total_steps"]) == (3, 3, 30)
    assert (settings["rollout.max_running_rows"], settings["checkpoint.save_hf_every"]) == (16, 3)
    shared = time_to_score.run_settings(Namespace(**{**vars(args), "mode": "sync"}))
    assert "engine.cpus" not in shared and "trainer.cpus" not in shared  # shared: every core for each phase
    assert "layout" not in settings and "layout" not in shared


def test_the_reference_is_sync_at_its_faster_layout():
    sync = [{**run([(0, 0.0, 0.2), (4, 20.0, 0.6)]), "train_wall_s": 40.0}]
    split = [{**run([(0, 0.0, 0.3), (4, 10.0, 0.5)]), "train_wall_s": 30.0}]
    assert time_to_score.reference_mode({"sync": sync, "sync@split": split, "fully_async": sync}) == "sync@split"
    assert time_to_score.targets({"sync": sync, "sync@split": split})[:2] == (0.3, 0.4)  # sync@split: last two 0.3, 0.5
    assert time_to_score.reference_mode({"sync": sync}) == "sync"
