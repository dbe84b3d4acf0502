"""What this computer's processor does for training: whether it multiplies bf16 in hardware,
and how much of it other work takes."""
from __future__ import annotations

import functools
import os
import time

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


class OthersLoad:
    """How much of this computer's cores other work used while the run trained: a run's
    tokens/s on a shared machine moves with it, so each metrics row notes it (`others_cpu`,
    0 = the machine to itself, 1 = every core busy with something else) and the calculator
    weighs the measurement by it. From /proc/stat (every core's busy time, steal included: a
    VM's host taking the core is other work too) less this process's own CPU seconds; None
    where there is no /proc/stat."""

    def __init__(self) -> None:
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.cores = os.cpu_count() or 1
        self.last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu" or len(fields) < 9:
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
        busy_s = (user + nice + system + irq + softirq + steal) / self.hz
        return time.monotonic(), busy_s, time.process_time()

    def since_last(self) -> float | None:
        """The share of the cores other work used since the last call (or since made)."""
        now, before = self._read(), self.last
        self.last = now
        if now is None or before is None or now[0] - before[0] < 0.2:  # jiffies are 10 ms: too short to tell
            return None
        others_s = (now[1] - before[1]) - (now[2] - before[2])
        return round(min(1.0, max(0.0, others_s / ((now[0] - before[0]) * self.cores))), 2)
