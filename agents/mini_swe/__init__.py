"""mini-swe-agent (2.4.6, its released code unchanged) as a fullasync `CustomGenerator`: see `generator.py`.

Names are imported lazily, so the harness process (`python -m fullasync_agents.mini_swe.runner`) loads
mini-swe-agent and litellm only, not fullasync.
"""

from __future__ import annotations

from fullasync_agents.lazy_exports import lazy_getattr

_EXPORTS = {
    "MiniSweConfig": "fullasync_agents.mini_swe.config",
    "MiniSweAgentGenerator": "fullasync_agents.mini_swe.generator",
    "HarnessError": "fullasync_agents.mini_swe.generator",
    "HarnessCrashedError": "fullasync_agents.launcher",
    "HarnessTimeoutError": "fullasync_agents.launcher",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
