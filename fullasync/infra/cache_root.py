"""Where fullasync keeps what it builds once and reuses (models, warm-ups, the installed vLLM's argument names):
`$FULLASYNC_CACHE_DIR`, else `~/.cache/fullasync`. Stdlib only."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "FULLASYNC_CACHE_DIR"  # environment variable overriding the default cache root


def default_cache_root() -> Path:
    """`$FULLASYNC_CACHE_DIR` if set and non-empty, else `~/.cache/fullasync`."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "fullasync"
