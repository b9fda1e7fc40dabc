"""The driver's cyclic garbage collector, tuned for thousands of live episodes (`settled_heap`).

Owns: the collector's thresholds for the length of a run, and freezing what start-up left alive. Does not own: what
runs meanwhile (a run, an evaluation, a benchmark's driver).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Python's defaults: (700, 10, 10). A young collection traverses every container allocated since the last one
# and still alive; with thousands of episodes in flight most of them are (token lists of running calls). At
# 1,000,000 the episodes' objects die (by reference counting: an episode holds no cycle) before a collection sees
# them (bench/control_plane.py; the figures: docs/benchmarks/figures.md).
GC_THRESHOLDS = (1_000_000, 20, 100)


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """Tune the driver's cyclic garbage collector for thousands of live episodes, for the length of a run.

    On entry: collects, freezes every object alive after start-up (modules, tokenizers, engine handles) out of
    the collector's reach, and makes collections rarer (`GC_THRESHOLDS`). With the defaults, collections scale
    with the live episodes' objects and took half the driver's CPU at 8,192 concurrent episodes
    (bench/control_plane.py, docs/benchmarks/control-plane.md); almost all of a run's garbage is freed by reference
    counting anyway, and what is cyclic waits a little longer. On exit: the frozen objects return to the collector
    and the previous thresholds are restored, so a process that runs again (or does anything else) leaks nothing.
    Inside another block (an evaluation started by a program that runs one already) it changes nothing.
    """
    if gc.get_threshold() == GC_THRESHOLDS:  # inside another block: that one settled the heap and gives it back
        yield
        return
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
