"""Each logger the run can ask for, opened for real offline: W&B (offline mode), MLflow (a file store), SwanLab
(offline mode). Metrics and rollout-sample tables land where the logger's own tools read them, and a resumed
run continues the same logger run (its id kept in output_dir/tracking.json)."""

from __future__ import annotations

import json
import re
import types

import pytest

from fullasync.observe.metrics import MetricsSink
from fullasync.observe.samples import RolloutSamples
from fullasync.observe.tracking import IDS_FILE, TrackingSettings, open_loggers
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

CONFIG = {"mode": "fully_async", "rollout.n": 8, "logging.loggers": ["wandb"]}


class Letters:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i) for i in ids)


def run_two_steps(tmp_path, logger, first_step, resume):
    settings = TrackingSettings((logger,), "fullasync-test", "two-steps", True, tmp_path)
    loggers = open_loggers(settings, CONFIG, resume=resume)
    sink = MetricsSink(None, loggers, RolloutSamples(tmp_path / "rollouts", Letters(), every=1))
    call = ModelCall((0, 1), (2, 3), (-0.1, -0.2), (first_step, first_step), FinishReason.STOP)
    groups = [TrajectoryGroup("row-3", (Trajectory((call,), 1.0),))]
    for step in (first_step, first_step + 1):
        sink.write(step, {"reward/mean": step / 10, "correction/kl_k1": 0.1, "correction/kl_k1/gap_0": 0.2})
        sink.samples(step, groups, trainer_version=step)
    sink.close()
    return loggers[0].run_id


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no credentials of this machine, none written here


def test_mlflow_file_store_holds_metrics_params_and_sample_tables_and_a_resume_continues_the_run(tmp_path,
                                                                                              offline_env):
    from mlflow.tracking import MlflowClient

    first = run_two_steps(tmp_path, "mlflow", 1, resume=False)
    again = run_two_steps(tmp_path, "mlflow", 3, resume=True)
    assert again == first == json.loads((tmp_path / IDS_FILE).read_text())["mlflow"]
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run = client.get_run(first)
    assert run.info.status == "FINISHED" and run.data.params["rollout.n"] == "8"
    assert run.info.run_name == "two-steps"
    history = client.get_metric_history(first, "reward.mean")  # a file store: "/" in metric names is "."
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    table = json.loads((tmp_path / "mlruns").joinpath(run.info.experiment_id, first, "artifacts", "rollouts",
                                                      "step_4.json").read_text())
    assert table["columns"][:6] == ["row_id", "episode", "call", "reward", "prompt", "completion"]
    assert table["data"] == [["row-3", 0, 0, 1.0, "ab", "cd", "stop", 1, 0]]  # staleness 4 − 3 = 1
    fresh = run_two_steps(tmp_path, "mlflow", 1, resume=False)  # not a resume: a new run
    assert fresh != first


@pytest.mark.parametrize("same_second", [False, True])
def test_wandb_offline_run_holds_the_samples_table_and_a_resume_reuses_its_id(tmp_path, offline_env, monkeypatch,
                                                                             same_second):
    # W&B names a run's folder by the second it started in; a start in the same second as the one before gets a
    # "-1" suffix. Its start clock is pinned so that each case happens on any machine, however fast.
    from wandb.sdk import wandb_init
    starts = iter([1_800_000_000.0, 1_800_000_000.0 if same_second else 1_800_000_001.0])
    monkeypatch.setattr(wandb_init, "time", types.SimpleNamespace(time=lambda: next(starts)))
    first = run_two_steps(tmp_path, "wandb", 1, resume=False)
    again = run_two_steps(tmp_path, "wandb", 3, resume=True)
    assert again == first
    runs = [run for run in (tmp_path / "wandb").glob(f"offline-run-*-{first}*")
            if re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{first}(-\d+)?", run.name)]
    assert len(runs) == 2 and any(run.name.endswith("-1") for run in runs) == same_second
    assert all((run / f"run-{first}.wandb").stat().st_size > 0 for run in runs)
    tables = {path.name.split("_")[1]: path for run in runs
              for path in run.glob("files/media/table/rollouts_*.table.json")}
    assert sorted(tables) == ["1", "2", "3", "4"]  # the resumed run's steps went on in the same run id
    assert json.loads(tables["4"].read_text())["data"] == [["row-3", 0, 0, 1.0, "ab", "cd", "stop", 1, 0]]


def test_swanlab_offline_run_is_written_under_output_dir_and_a_resume_reuses_its_id(tmp_path, offline_env):
    first = run_two_steps(tmp_path, "swanlab", 1, resume=False)
    again = run_two_steps(tmp_path, "swanlab", 3, resume=True)
    assert again == first
    runs = list((tmp_path / "swanlog").glob(f"run-*-{first}"))
    assert runs and all((run / f"run-{first}.swanlab").stat().st_size > 0 for run in runs)
    texts = [path.read_text() for run in runs for path in (run / "media").rglob("*.txt")]
    assert any('"completion": "cd"' in text for text in texts)
