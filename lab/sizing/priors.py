"""Each card's prior for the speed fit (`lab.sizing.steptime`): seconds per unit of each part
of a step before the lab has measured anything on that card, anchored to one measurement.

The shape (how a step's time splits into its parts) comes from the card's rates: matrix and
attention FLOP rates, memory bandwidth for the elementwise work, launch and Python costs. The
anchor scales it: the guide's measurement on 2×T4 and on one T4 at the reference size; for the
RTX 3050 and for a CPU the lab's rough guesses, whose intervals say so. A measured run on the
card replaces the anchor (`lab.sizing.speeds`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from lab.sizing.cards import REFERENCE, Card
from lab.sizing.steptime import Point, Size

# This CPU's parts, measured by `OMP_NUM_THREADS=1 scripts/bench_prior.py --cpu-clock --rounds 3`:
# the lean step (model, fused AdamW, clipping, autocast) on its grid of 26 sizes, on one core of
# the 2-vCPU Intel Xeon VM the kit is developed on (lscpu: "Intel(R) Xeon(R) Processor",
# AVX512-BF16/FP16, L2 2 MiB a core), torch 2.13 CPU build, timed in CPU seconds so that other
# work on that shared machine moves them less (each size's median step in the fastest of 3
# rounds; measured 2026-12-01 beside one other single-threaded benchmark). The fit's worst misfit
# on the grid: 21% in fp32 and 14% in bf16 at 4 layers d 64 batch 32, and 26% at one bf16 size
# (2 layers d 128 n 512) that measured 37% slower than hours before; the rest within 13%. The
# step times are kept in scripts/measured/bench_prior-xeon-1core-*.json; `scripts/bench_prior.py
# --fit fp32 FILE` prints these lines again from them (tests/sizing holds the two equal). Seconds
# per unit of (matmul FLOP, attention FLOP, activation element, spilled activation element,
# logit, weight, layer, micro-step); the first six run on every core, per layer and per step
# they do not. bf16 autocast is the slower of the two here at these sizes (1.5-2.5x): its casts
# cost more than its products save.
CPU_CORES_MEASURED = 1
CPU_PARTS = {
    "fp32": (4.33e-12, 7.81e-12, 4.52e-08, 1.24e-07, 3.5e-09, 2.62e-09, 0.0, 0.0),
    "bf16": (8.76e-12, 1.26e-11, 1.15e-07, 1.38e-07, 3.6e-09, 4.18e-09, 4.91e-04, 0.0),
}
CPU_PARALLEL_PARTS = 6  # the first six parts scale with the cores
CPU_ANCHOR_NOISE = 0.5  # another CPU: ×/÷ e^(1.96·0.5) ≈ 2.7 either way until a run here measures it


def _gpu_parts(matmul_tflops: float, attention_tflops: float, gb_s: float, allreduce_gb_s: float = 0.0,
               launch_s: float = 1e-4, step_s: float = 2e-3) -> tuple[float, ...]:
    """A GPU's parts from its rates. Bytes per unit: an activation element is read and written
    about 40 bytes' worth over forward and backward in 16-bit; a logit 16 (fp32 softmax and its
    gradient); a weight 36 (fused AdamW's fp32 state and the 16-bit copy), plus what one DDP
    all-reduce leaves exposed after the backward pass (a fifth of 4 bytes' ring transfer)."""
    per_weight = 36 / (gb_s * 1e9) + (0.2 * 4 / (allreduce_gb_s * 1e9) if allreduce_gb_s else 0.0)
    return (1 / (matmul_tflops * 1e12), 1 / (attention_tflops * 1e12), 40 / (gb_s * 1e9), 0.0, 16 / (gb_s * 1e9),
            per_weight, launch_s, step_s)


# T4: 65 TFLOPS fp16 peak, about 20 in the lab's d-512 products, 10 in attention; 320 GB/s, 250 in
# practice. Two T4s all-reduce over PCIe at ~5 GB/s. RTX 3050: ~18 TFLOPS bf16 with fp32
# accumulation (12 in practice), 224 GB/s.
GPU_PARTS = {
    "2xT4": _gpu_parts(20, 10, 250, allreduce_gb_s=5),
    "T4": _gpu_parts(20, 10, 250),
    "rtx3050": _gpu_parts(12, 6, 180),
}
GUIDE_NOISE = 0.05  # the guide's own measurement
GUESS_NOISE = 0.3  # a card the guide did not measure, guessed from its rates
SHAPE_SPREAD = {"cpu": 0.3, "gpu": 0.6}  # how far one part may be off the prior's shape


@dataclass(frozen=True)
class Prior:
    """A card's parts before the lab's measurements: `parts` scaled so that the prior
    reproduces `anchor`."""
    card: str
    precision: str
    parts: tuple[float, ...]
    shape_spread: float
    anchor: Point
    measured: bool  # the anchor is a measurement (the guide's), not a guess
    note: str
    note_ru: str


def reference_size(card: Card) -> Size:
    r = REFERENCE
    return Size(r["context"], r["width"], r["layers"], r["vocab"], r["batch_per_card"], 1, card.cards)


def prior(card: Card, precision: str) -> Prior:
    """The prior of `card` trained in `precision` (on a GPU the card's own precision's: another
    is emulated, and the calculator says so)."""
    if card.name == "cpu":
        return _cpu_prior(card, precision if precision in CPU_PARTS else card.precision)
    parts = GPU_PARTS.get(card.name, GPU_PARTS["T4"])  # a box's card: a T4's shape, its own measured scale
    size = reference_size(card)
    step_s = size.tokens_per_step / card.ref_tok_s
    scale = step_s / sum(c * x for c, x in zip(parts, size.parts()))
    anchor = Point("guide" if card.ref_measured else "guess", size, step_s,
                   GUIDE_NOISE if card.ref_measured else GUESS_NOISE)
    basis = ("the guide's measurement", "замера из гайда") if card.ref_measured else \
        ("the lab's rough guess", "грубой прикидки лабы")
    return Prior(card.name, card.precision, tuple(c * scale for c in parts), SHAPE_SPREAD["gpu"], anchor,
                 card.ref_measured, f"{basis[0]} on {card.name} at the reference size",
                 f"{basis[1]} на {card.name} для эталонного размера")


def cpu_cores() -> int:
    """The cores torch trains on here: OMP_NUM_THREADS when set (torch's threads), else the
    cores this process may run on."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        pass
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _cpu_prior(card: Card, precision: str) -> Prior:
    """This CPU's parts from the measured machine's, the parallel ones scaled by the cores."""
    cores = cpu_cores()
    factor = CPU_CORES_MEASURED / cores
    parts = tuple(c * factor if i < CPU_PARALLEL_PARTS else c for i, c in enumerate(CPU_PARTS[precision]))
    size = reference_size(card)
    anchor = Point("guess", size, sum(c * x for c, x in zip(parts, size.parts())), CPU_ANCHOR_NOISE)
    return Prior("cpu", precision, parts, SHAPE_SPREAD["cpu"], anchor, False,
                 f"the lab's rough guess for {cores} CPU core(s) in {precision} (measured on "
                 f"{CPU_CORES_MEASURED} core(s) of an Intel Xeon; yours may differ 3× either way: a short run here "
                 f"measures it)",
                 f"грубой прикидки лабы для {cores} ядер CPU в {precision} (замер на Intel Xeon, "
                 f"ядер: {CPU_CORES_MEASURED}; ваш может отличаться втрое в любую сторону: короткий прогон "
                 f"здесь измерит его)")
