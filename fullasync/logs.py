"""What a run prints: the `fullasync` logger, set up once by the entry points.

Owns: `configure_logging()`, which `fullasync train` and `AsyncAgentTrainer.train` call: `[fullasync] ...`
lines and the unprefixed per-step line (logger `fullasync.steps`) on stdout, and third-party
chatter turned down to warnings. Library code only logs through `logging.getLogger("fullasync...")`;
it never prints, so embedding code (the simulator, a user's own process) decides what it shows.
"""

from __future__ import annotations

import logging
import sys

QUIET = {"ray": logging.ERROR,  # its start-up notices (token auth on a loopback cluster, ...) are not ours to show
         **{name: logging.WARNING for name in ("vllm", "transformers", "torch", "datasets", "filelock", "httpx",
                                                "urllib3", "asyncio")}}


class _Stdout(logging.StreamHandler):
    """Our handler (a type of its own, so a second `configure_logging` adds nothing)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(_Lines())


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
