"""Peak memory of a phase of this process: the GPU allocator's peak on a GPU rank, the peak
resident set (VmHWM, reset through /proc/self/clear_refs) on a CPU rank.

Why RSS on CPU: torch's CPU allocator keeps no peak statistics, and a CPU rank's memory is what
the memory plan predicts for a GPU (tbhpc/plan/memory.py is checked against these figures). Large
tensors live in their own memory maps (glibc hands out blocks above its mmap threshold that way
and gives them back on free), so RSS follows the live tensors; `MALLOC_MMAP_THRESHOLD_=65536`
in a measuring process's environment keeps that threshold from drifting upwards.
"""
from __future__ import annotations

from pathlib import Path


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rss() -> int:
    """Resident bytes now."""
    return _status("VmRSS")


def reset_peak(gpu: bool = False) -> None:
    if gpu:
        import torch
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:       # not Linux, or not allowed: the peak then covers the process's life
        pass


def peak(gpu: bool = False) -> int:
    """Peak bytes since the last reset_peak (GPU: allocated by torch; CPU: resident)."""
    if gpu:
        import torch
        return int(torch.cuda.max_memory_allocated())
    return _status("VmHWM")
