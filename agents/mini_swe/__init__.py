"""mini-swe-agent (2.4.6, its released code unchanged) as a fullasync `CustomGenerator`: see `generator.py`.

Names are imported lazily, so the harness process (`python -m fullasync_agents.mini_swe.runner`) loads
mini-swe-agent and litellm only, not fullasync.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MiniSweConfig": "fullasync_agents.mini_swe.config",
    "MiniSweAgentGenerator": "fullasync_agents.mini_swe.generator",
    "HarnessError": "fullasync_agents.mini_swe.generator",
    "HarnessCrashedError": "fullasync_agents.mini_swe.launcher",
    "HarnessTimeoutError": "fullasync_agents.mini_swe.launcher",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fullasync_agents.mini_swe' has no attribute {name!r}")
