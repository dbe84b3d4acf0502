"""What this computer's processor does for training: whether it multiplies bf16 in hardware."""
from __future__ import annotations

import functools

# CPU features that multiply bf16 in hardware (x86 names, as /proc/cpuinfo lists them).
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_precision(cpuinfo: str = "/proc/cpuinfo") -> str:
    """What precision "auto" trains in on a CPU: bf16 autocast where the processor multiplies
    bf16 in hardware (`lab train` on a 2-core EPYC with AVX512-BF16: 1.2x fp32 at the demo's size,
    1.9x at d 256; weights, optimizer and loss stay fp32), else fp32 (emulated bf16 is slower)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:  # not Linux: no flags to read, so no claim of bf16
        return "fp32"
    return "bf16" if any(flag in flags for flag in CPU_BF16_FLAGS) else "fp32"
