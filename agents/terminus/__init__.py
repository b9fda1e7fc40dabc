"""Terminus-2 (harbor 0.24.0, its released code unchanged) as a fullasync `CustomGenerator`: see `generator.py`.

Names are imported lazily: the harness side (`runner.py`, `sandbox_environment.py`) runs in the harbor
interpreter (Python >= 3.12) and must not load the trainer's modules, nor the trainer harbor's.
"""

from __future__ import annotations

from fullasync_agents.lazy_exports import lazy_getattr

_EXPORTS = {
    "TerminusConfig": "fullasync_agents.terminus.config",
    "Terminus2Generator": "fullasync_agents.terminus.generator",
    "HarnessError": "fullasync_agents.terminus.generator",
    "HarborMissingError": "fullasync_agents.terminus.interpreter",
    "HarnessCrashedError": "fullasync_agents.launcher",
    "HarnessTimeoutError": "fullasync_agents.launcher",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
