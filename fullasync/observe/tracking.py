"""Loggers: where a run's metrics and rollout samples go besides output_dir/metrics.jsonl and the console.

Owns: the loggers a run may ask for (`logging.loggers`: wandb, mlflow, swanlab, tensorboard); checking them
before anything starts (`check_loggers`: importable, credentials when online, an MLflow server reachable), so
a missing package or key fails the run in a second instead of after the engines and the trainer started;
opening one run per logger with the run's config and name, its id kept in output_dir/tracking.json so that a
resumed run continues the same logger run; logging a step's metrics and its decoded rollout samples (a table
where the logger has tables). Does not own: what a step's metrics are (`fullasync.observe.metrics`), the JSONL file
(`MetricsSink`) or the decoded samples (`fullasync.observe.samples`).

Offline use (`logging.offline=true`, or WANDB_MODE=offline / SWANLAB_MODE=offline): W&B and SwanLab write
their runs under output_dir (`wandb sync`, `swanlab sync` upload them later); MLflow writes a file store at
output_dir/mlruns unless MLFLOW_TRACKING_URI names a store (a server is then checked for reachability).
"""

from __future__ import annotations

import importlib.util
import json
import netrc
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fullasync.config.checks import validate_logger_names
from fullasync.errors import FullasyncError
from fullasync.observe.samples import Record

IDS_FILE = "tracking.json"  # under output_dir: {logger: run id}, read back by a resumed run
OFFLINE_MODES = {"wandb": ("offline", "dryrun", "disabled"), "swanlab": ("offline", "local", "disabled")}
SERVER_CHECK_TIMEOUT_S = 5.0
MLFLOW_PARAM_CHARS = 500  # an MLflow parameter value holds at most this much (older servers' limit)
MLFLOW_BATCH = 100  # parameters per log_batch call (MLflow's limit)


class LoggerUnavailableError(FullasyncError, RuntimeError):
    """A logger that was asked for cannot be used here (the message says why and what to do)."""


@dataclass(frozen=True)
class TrackingSettings:
    """The run's `logging` section as the loggers need it."""

    loggers: tuple[str, ...]
    project: str
    run_name: str  # "" = the output directory's name
    offline: bool
    output_dir: Path

    @property
    def name(self) -> str:
        return self.run_name or self.output_dir.resolve().name


def wandb_offline(settings: TrackingSettings) -> bool:
    return settings.offline or os.environ.get("WANDB_MODE", "").lower() in OFFLINE_MODES["wandb"]


def swanlab_offline(settings: TrackingSettings) -> bool:
    return settings.offline or os.environ.get("SWANLAB_MODE", "").lower() in OFFLINE_MODES["swanlab"]


def mlflow_uri(settings: TrackingSettings) -> str:
    """MLFLOW_TRACKING_URI when set and not offline; else a file store under output_dir."""
    configured = os.environ.get("MLFLOW_TRACKING_URI", "")
    if configured and not settings.offline:
        return configured
    return (settings.output_dir / "mlruns").resolve().as_uri()


def check_loggers(settings: TrackingSettings) -> None:
    """Raise `LoggerUnavailableError` naming the first logger that cannot work here, and the fix."""
    validate_logger_names(settings.loggers)
    for name in settings.loggers:
        if importlib.util.find_spec(name) is None:  # each logger's import name is its own
            raise LoggerUnavailableError(f"logging.loggers has {name}, but the {name} package is not installed: "
                                         f"pip install 'fullasync[tracking]' (or {name}), or drop {name} from "
                                         "logging.loggers")
    if "wandb" in settings.loggers and not wandb_offline(settings) and not _wandb_credentials():
        raise LoggerUnavailableError("logging.loggers has wandb (online) but no W&B credentials were found: run "
                                     "`wandb login`, set WANDB_API_KEY, or log offline (logging.offline=true or "
                                     "WANDB_MODE=offline; `wandb sync` uploads later)")
    if "swanlab" in settings.loggers and not swanlab_offline(settings) and not _swanlab_credentials():
        raise LoggerUnavailableError("logging.loggers has swanlab (cloud) but no SwanLab credentials were found: "
                                     "run `swanlab login`, set SWANLAB_API_KEY, or log offline "
                                     "(logging.offline=true or SWANLAB_MODE=offline)")
    if "mlflow" in settings.loggers:
        uri = mlflow_uri(settings)
        if urllib.parse.urlparse(uri).scheme in ("http", "https"):
            _check_mlflow_server(uri)


def _wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    return _netrc_has(Path.home() / ".netrc", host)


def _swanlab_credentials() -> bool:
    if os.environ.get("SWANLAB_API_KEY"):
        return True
    return any((folder / ".swanlab" / ".netrc").is_file() for folder in (Path.cwd(), Path.home()))


def _netrc_has(path: Path, host: str) -> bool:
    try:
        return path.is_file() and netrc.netrc(str(path)).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):
        return False


def _check_mlflow_server(uri: str) -> None:
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=SERVER_CHECK_TIMEOUT_S) as response:
            response.read()
    except (urllib.error.URLError, OSError) as error:
        raise LoggerUnavailableError(f"logging.loggers has mlflow, but the MLflow server at {uri} "
                                     f"(MLFLOW_TRACKING_URI) does not answer ({error}): start it, fix "
                                     "MLFLOW_TRACKING_URI, or unset it (or logging.offline=true) for a file store "
                                     "under output_dir/mlruns") from None


class Logger(Protocol):
    """One open logger run."""

    name: str
    run_id: str

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None: ...  # one row per model call

    def close(self) -> None: ...


SAMPLE_COLUMNS = ("row_id", "episode", "call", "reward", "prompt", "completion", "finish_reason", "staleness",
                  "resumed")


def sample_rows(records: Sequence[Record]) -> list[dict[str, object]]:
    """`RolloutSamples.record`s flattened to one table row per model call (columns `SAMPLE_COLUMNS`)."""
    return [{"row_id": record["row_id"], "episode": record["episode"], "call": index, "reward": record["reward"],
             "prompt": call["prompt"], "completion": call["completion"], "finish_reason": call["finish_reason"],
             "staleness": call["staleness"], "resumed": call["resumed"]}
            for record in records for index, call in enumerate(record["calls"])]


class WandbLogger:
    name = "wandb"

    def __init__(self, settings: TrackingSettings, config: Mapping[str, object], run_id: str | None) -> None:
        import wandb

        self._wandb = wandb
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._run = wandb.init(project=settings.project, name=settings.name, id=self.run_id, resume="allow",
                               config=dict(config), dir=str(settings.output_dir),
                               mode="offline" if wandb_offline(settings) else "online")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        table = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[row[c] for c in SAMPLE_COLUMNS] for row in rows])
        self._run.log({"rollouts": table}, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowLogger:
    name = "mlflow"

    def __init__(self, settings: TrackingSettings, config: Mapping[str, object], run_id: str | None) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = mlflow_uri(settings)
        # A file store keeps each metric in a file named by its key, so a key cannot also be a folder of other keys
        # (correction/kl_k1 beside correction/kl_k1/gap_0): there, "/" in a metric's name becomes ".".
        self._file_store = uri.startswith("file:")
        if self._file_store:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # a store we chose: local files, by design
        self._client = MlflowClient(uri)
        if run_id is not None:
            self._client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return
        experiment = self._client.get_experiment_by_name(settings.project)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self._client.create_experiment(settings.project))
        self.run_id = self._client.create_run(experiment_id, run_name=settings.name).info.run_id
        params = [Param(key, str(value)[:MLFLOW_PARAM_CHARS]) for key, value in config.items()]
        for start in range(0, len(params), MLFLOW_BATCH):
            self._client.log_batch(self.run_id, params=params[start:start + MLFLOW_BATCH])

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(self.metric_key(key), float(value), now, step)
                                                     for key, value in metrics.items()])

    def metric_key(self, key: str) -> str:
        return key.replace("/", ".") if self._file_store else key

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        columns = {column: [row[column] for row in rows] for column in SAMPLE_COLUMNS}
        self._client.log_table(self.run_id, data=columns, artifact_file=f"rollouts/step_{step}.json")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


class SwanlabLogger:
    name = "swanlab"

    def __init__(self, settings: TrackingSettings, config: Mapping[str, object], run_id: str | None) -> None:
        import swanlab

        self._swanlab = swanlab
        self.run_id = run_id or uuid.uuid4().hex[:21]
        self._run = swanlab.init(project=settings.project, name=settings.name, id=self.run_id, resume="allow",
                                 config=dict(config), log_dir=str(settings.output_dir / "swanlog"),
                                 mode="offline" if swanlab_offline(settings) else "online")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        texts = [self._swanlab.Text(json.dumps(row, default=repr)) for row in rows]
        self._run.log({"rollouts": texts}, step=step)

    def close(self) -> None:
        self._run.finish()


class TensorboardLogger:
    name = "tensorboard"

    def __init__(self, settings: TrackingSettings, config: Mapping[str, object], run_id: str | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_id = run_id or "tensorboard"
        self._writer = SummaryWriter(str(settings.output_dir / "tensorboard"))
        self._writer.add_text("config", "\n".join(f"    {key} = {value}" for key, value in config.items()), 0)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        self._writer.add_text("rollouts", "\n\n".join("    " + json.dumps(row, default=repr) for row in rows), step)

    def close(self) -> None:
        self._writer.close()


LOGGER_TYPES: dict[str, type] = {"wandb": WandbLogger, "mlflow": MlflowLogger, "swanlab": SwanlabLogger,
                                 "tensorboard": TensorboardLogger}


def open_loggers(settings: TrackingSettings, config: Mapping[str, object], resume: bool) -> list[Logger]:
    """One run per logger; a resumed run (`resume`) continues the runs named in output_dir/tracking.json."""
    ids_path = settings.output_dir / IDS_FILE
    known: dict[str, str] = json.loads(ids_path.read_text()) if resume and ids_path.is_file() else {}
    opened: list[Logger] = []
    try:
        for name in settings.loggers:
            opened.append(LOGGER_TYPES[name](settings, config, known.get(name)))
    except BaseException:
        close_loggers(opened)
        raise
    if opened:
        settings.output_dir.mkdir(parents=True, exist_ok=True)
        ids_path.write_text(json.dumps({**known, **{logger.name: logger.run_id for logger in opened}}, indent=1))
    return opened


def close_loggers(loggers: Sequence[Logger]) -> None:
    for logger in loggers:
        logger.close()
