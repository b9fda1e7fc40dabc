"""What a run prints: the `fullasync` logger, set up once by the entry points, and its live progress display.

Owns: `configure_logging()`, which `fullasync train` and `AsyncAgentTrainer.train` call: `[fullasync] ...`
lines and the unprefixed per-step line (logger `fullasync.steps`) on stdout, and third-party
chatter turned down to warnings; `progress(...)`, the `extra` of a record that reports how far a phase is
(start-up phases, validation episodes, train steps); `progress_display()`, which on a terminal shows those
phases as live bars (rich) with the lines printed above them, and in logs and CI leaves plain lines.
Library code only logs through `logging.getLogger("fullasync...")`; it never prints, so embedding code
(the simulator, a user's own process) decides what it shows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

PLAIN_ENV = "FULLASYNC_PLAIN"  # set (to anything but "" or 0): plain lines even on a terminal
TRANSIENT_EVERY_S = 30.0  # plain output shows a phase's in-between progress at most this often

QUIET = {"ray": logging.ERROR,  # its start-up notices (token auth on a loopback cluster, ...) are not ours to show
         **{name: logging.WARNING for name in ("vllm", "transformers", "torch", "datasets", "filelock", "httpx",
                                                "urllib3", "asyncio")}}


def progress(phase: str, done: int, total: int, transient: bool = False) -> dict[str, Any]:
    """The `extra=` of a log record saying that `phase` is at `done` of `total`. A `transient` record only
    reports progress: a terminal shows it in the phase's bar, plain output at most every TRANSIENT_EVERY_S (and
    when the phase completes)."""
    return {"progress": (phase, done, total), "transient": transient}


class _Stdout(logging.StreamHandler):
    """Our handler (a type of its own, so a second `configure_logging` adds nothing)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(_Lines())
        self._shown: dict[str, float] = {}  # phase -> when its last transient line was shown

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "transient", False):
            return super().filter(record)
        phase, done, total = record.progress  # type: ignore[attr-defined]  # set by progress()
        now = time.monotonic()
        if done < total and now - self._shown.get(phase, -TRANSIENT_EVERY_S) < TRANSIENT_EVERY_S:
            return False
        self._shown[phase] = now
        return super().filter(record)


class _Live(logging.Handler):
    """On a terminal: each record's line printed above the live bars, and the bar of its phase moved on."""

    def __init__(self, stream: IO[str], force_terminal: bool | None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        super().__init__()
        self.setFormatter(_Lines())
        console = Console(file=stream, force_terminal=force_terminal)
        self.bars = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description:<10}"),
                             BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left"),
                             TimeRemainingColumn(), console=console)
        self._tasks: dict[str, Any] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "transient", False):
            self.bars.console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)
        report = getattr(record, "progress", None)
        if report is not None:
            phase, done, total = report
            if phase not in self._tasks:
                self._tasks[phase] = self.bars.add_task(phase, total=total)
            self.bars.update(self._tasks[phase], completed=done, total=total)


def _plain_forced() -> bool:
    return os.environ.get(PLAIN_ENV, "") not in ("", "0")


@contextlib.contextmanager
def progress_display(stream: IO[str] | None = None, force_terminal: bool | None = None) -> Iterator[None]:
    """Live progress bars while the block runs, when `stream` (stdout) is a terminal (or `force_terminal`) and
    FULLASYNC_PLAIN is not set; otherwise the plain lines of `configure_logging`, unchanged."""
    stream = stream if stream is not None else sys.stdout
    terminal = force_terminal if force_terminal is not None else stream.isatty()
    if not terminal or _plain_forced():
        yield
        return
    logger = logging.getLogger("fullasync")
    plain = [handler for handler in logger.handlers if isinstance(handler, _Stdout)]
    live = _Live(stream, force_terminal)
    for handler in plain:
        logger.removeHandler(handler)
    logger.addHandler(live)
    live.bars.start()
    try:
        yield
    finally:
        live.bars.stop()
        logger.removeHandler(live)
        for handler in plain:
            logger.addHandler(handler)


class _Lines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.name == "fullasync.steps":
            return text
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"[fullasync] {level}{text}"


def configure_logging(level: int = logging.INFO) -> None:
    """Send `fullasync` logs to stdout (once per process) and quiet the libraries under it."""
    logger = logging.getLogger("fullasync")
    if not any(isinstance(handler, _Stdout) for handler in logger.handlers):
        logger.addHandler(_Stdout())
        logger.propagate = False
    logger.setLevel(level)
    for name, quiet in QUIET.items():
        logging.getLogger(name).setLevel(max(quiet, level))
