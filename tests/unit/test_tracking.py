"""Loggers asked for in the config are checked before anything starts, each failure naming the fix; the live
progress display shows the run's phases as bars with the lines above them (the loggers' own runs:
tests/integration/test_loggers.py)."""

from __future__ import annotations

import importlib.util
import io
import logging
import socket

import pytest

from fullasync.config import RunConfig
from fullasync.observe.logs import _Stdout, configure_logging, progress, progress_display
from fullasync.observe.tracking import LoggerUnavailableError, TrackingSettings, check_loggers


def settings(tmp_path, *loggers, offline=False):
    return TrackingSettings(tuple(loggers), "project", "", offline, tmp_path)


def test_the_config_refuses_unknown_or_repeated_logger_names():
    config = RunConfig()
    config.logging.loggers = ["wandb", "neptune"]
    with pytest.raises(ValueError, match=r"\['neptune'\] unknown; choose from \['wandb', 'mlflow'"):
        config.validate()
    config.logging.loggers = ["mlflow", "mlflow"]
    with pytest.raises(ValueError, match="names a logger twice"):
        config.validate()


def test_a_logger_whose_package_is_missing_fails_with_the_install_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    with pytest.raises(LoggerUnavailableError, match=r"swanlab package is not installed: pip install "
                                                     r"'fullasync\[tracking\]'"):
        check_loggers(settings(tmp_path, "tensorboard", "swanlab", offline=True))


def test_online_wandb_and_swanlab_without_credentials_fail_before_the_run(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "SWANLAB_API_KEY", "SWANLAB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoggerUnavailableError, match="no W&B credentials.*logging.offline=true"):
        check_loggers(settings(tmp_path, "wandb"))
    with pytest.raises(LoggerUnavailableError, match="no SwanLab credentials"):
        check_loggers(settings(tmp_path, "swanlab"))
    check_loggers(settings(tmp_path, "wandb", "swanlab", offline=True))  # offline: nothing to log in to
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_loggers(settings(tmp_path, "wandb"))
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k" + "0" * 39 + "\n")
    monkeypatch.delenv("WANDB_MODE")
    check_loggers(settings(tmp_path, "wandb"))  # `wandb login` wrote its key here


def test_an_mlflow_server_that_does_not_answer_fails_before_the_run(tmp_path, monkeypatch):
    with socket.socket() as probe:  # a loopback port with nothing listening on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    with pytest.raises(LoggerUnavailableError, match=f"MLflow server at http://127.0.0.1:{port}.*does not answer"):
        check_loggers(settings(tmp_path, "mlflow"))
    check_loggers(settings(tmp_path, "mlflow", offline=True))  # offline: a file store under output_dir


def test_on_a_terminal_phases_are_live_bars_and_lines_print_above_them(monkeypatch):
    monkeypatch.delenv("FULLASYNC_PLAIN", raising=False)
    configure_logging()
    log = logging.getLogger("fullasync")
    screen = io.StringIO()
    with progress_display(screen, force_terminal=True):
        log.info("engine 1/2 ready: e0", extra=progress("engines", 1, 2))
        log.info("engine 2/2 ready: e1", extra=progress("engines", 2, 2))
        log.info("validation 3/8 episodes", extra=progress("validation", 3, 8, transient=True))
        logging.getLogger("fullasync.steps").info("step    1/3 | reward 0.1", extra=progress("steps", 1, 3))
    shown = screen.getvalue()
    assert "[fullasync] engine 1/2 ready: e0" in shown and "step    1/3 | reward 0.1" in shown
    assert "validation 3/8 episodes" not in shown  # a transient record only moves its bar
    assert "engines" in shown and "2/2" in shown and "validation" in shown and "3/8" in shown
    assert "━" in shown  # rich's bar


def test_plain_output_shows_transient_progress_sparingly(monkeypatch):
    monkeypatch.setenv("FULLASYNC_PLAIN", "1")
    configure_logging()
    log = logging.getLogger("fullasync")
    (plain,) = [handler for handler in log.handlers if isinstance(handler, _Stdout)]
    screen = io.StringIO()
    previous = plain.setStream(screen)
    try:
        with progress_display(force_terminal=True):  # plain lines were asked for, even on a terminal
            for done in range(1, 11):
                log.info("validation %d/10 episodes", done, extra=progress("val-plain", done, 10, transient=True))
    finally:
        plain.setStream(previous)
    assert screen.getvalue().splitlines() == ["[fullasync] validation 1/10 episodes",
                                              "[fullasync] validation 10/10 episodes"]
