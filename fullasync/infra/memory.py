"""A process's peak memory over a span of work, for the trainer's step metrics.

Owns: `PeakMemory` — on an accelerator, torch's allocator peak (reset at the span's start); on CPU, the resident
set's high-water mark (Linux: VmHWM in /proc/self/status, reset through /proc/self/clear_refs; where the reset is
refused the mark is the process's lifetime peak).
"""

from __future__ import annotations

from pathlib import Path

import torch

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
RESET_PEAK_RSS = "5"  # Linux: "5" resets the peak resident set size (proc(5), /proc/pid/clear_refs)


class PeakMemory:
    """`reset()` at a span's start, `read()` (bytes) at its end."""

    def reset(self) -> bool:
        """Start the span; False where the mark cannot be reset (the next read is the lifetime peak)."""
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            return True
        try:
            CLEAR_REFS.write_text(RESET_PEAK_RSS)
        except OSError:
            return False
        return True

    def read(self) -> int:
        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
        try:
            for line in STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
        except OSError:
            pass
        return 0
