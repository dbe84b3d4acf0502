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
from lab.sizing.machine import Shape, card_shape, local_shape, unsteady_local
from lab.sizing.steptime import NO_CURVES, NOISE, Curves, Point, Size

# This CPU's parts per thread count, measured by `OMP_NUM_THREADS=T scripts/bench_prior.py`: the
# lean step (model, fused AdamW, clipping, autocast) on its grid of sizes, torch 2.13 CPU build;
# `scripts/bench_prior.py --fit PRECISION FILE` prints these lines again from the step times kept
# in scripts/measured/ (tests/sizing holds the two equal). Seconds per unit of (matmul FLOP,
# attention FLOP, activation element, spilled activation element, logit, weight, layer,
# micro-step); the first six run on every thread, per layer and per step they do not.
# 1 thread: one core of a 2-vCPU Intel Xeon VM (AVX512-BF16), timed in CPU seconds, 2026-12-01
# (bench_prior-xeon-1core-*.json: the grid's first 26 sizes, each its median step in the fastest
# of 3 rounds); worst misfit on the grid 21% in fp32, 26% in bf16.
# 2 threads: what `lab train` takes on a 2-vCPU AMD EPYC VM (AVX512-BF16), the cores torch uses
# by default, timed in wall seconds with nothing else of ours running, 2026-12-02 03:52-04:06 UTC
# (bench_prior-epyc-2threads-*.json: 29 sizes, each its median step over 5 rounds of at least 2 s,
# 14 min); worst misfit on the grid 11% in fp32, 29% in bf16, whose matrix products cost next to
# nothing beside its casts and elementwise passes (the fit leans on the other parts: the parts of
# a few dozen sizes are not all told apart, and a size's fastest round was up to 1.6× faster than
# its median one on this VM).
CPU_PARTS = {
    1: {"fp32": (4.33e-12, 7.81e-12, 4.52e-08, 1.24e-07, 3.5e-09, 2.62e-09, 0.0, 0.0),
        "bf16": (8.76e-12, 1.26e-11, 1.15e-07, 1.38e-07, 3.6e-09, 4.18e-09, 4.91e-04, 0.0)},
    2: {"fp32": (3.65e-12, 6.59e-12, 4.63e-08, 1.24e-07, 2.67e-09, 4.51e-09, 0.000425, 0.0),
        "bf16": (0.0, 2.66e-12, 4.04e-08, 1.83e-07, 2.44e-09, 2.75e-09, 0.00155, 0.00129)},
}
CPU_MEASURED_ON = {1: ("one core of an Intel Xeon", "одном ядре Intel Xeon"),
                   2: ("a 2-vCPU AMD EPYC", "2-ядерном AMD EPYC")}
CPU_PARALLEL_PARTS = 6  # the first six parts spread over the threads
# One CPU run's tokens/s against another's at the same size, wall clock: on the 2-vCPU EPYC VM
# with nothing else of ours running (other work under 1% of the cores, steal included), the 27
# runs of scripts/bench_estimates.py's check (2026-12-02) moved within themselves by a median 11%
# (half their sync windows' 10-90% range) and the same size's runs by up to ±21% between rounds:
# the VM's neighbours share its memory and caches, which no CPU clock sees. A GPU's runs agree
# to a few percent (steptime.NOISE).
CPU_RUN_NOISE = 0.10
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
    threads: int | None = None  # a CPU's: the threads it is for
    run_noise: float = NOISE  # one run's tokens/s against another's at the same size on this card
    curves: Curves = NO_CURVES  # the rates by width and context, where the machine's parts were measured
    shape: Shape | None = None  # the machine's measured parts the shape comes from (None: the lab's prior)

    @property
    def shape_note(self) -> str:
        """Where the model's shape (how a step splits into its parts) comes from."""
        return self.shape.note if self.shape else "the lab's prior for the card (its parts not measured here)"

    @property
    def shape_note_ru(self) -> str:
        return self.shape.note_ru if self.shape else "априорная форма лабы для карты (её части здесь не измерены)"


def reference_size(card: Card) -> Size:
    r = REFERENCE
    return Size(r["context"], r["width"], r["layers"], r["vocab"], r["batch_per_card"], 1, card.cards)


def prior(card: Card, precision: str, threads: int | None = None) -> Prior:
    """The prior of `card` trained in `precision` (on a GPU the card's own precision's: another
    is emulated, and the calculator says so); a CPU's on `threads` (default: `cpu_threads()`)."""
    if card.name == "cpu":
        precision, threads = precision if precision in ("fp32", "bf16") else card.precision, threads or cpu_threads()
        shape = local_shape(precision, threads)
        return _measured_cpu_prior(card, precision, threads, shape) if shape else _cpu_prior(card, precision, threads)
    shape = card_shape(card.name, card.precision)
    # A box's card without a measurement of its parts: a T4's shape, its own measured scale.
    parts, curves = (shape.parts, shape.curves) if shape else (GPU_PARTS.get(card.name, GPU_PARTS["T4"]), NO_CURVES)
    size = reference_size(card)
    step_s = size.tokens_per_step / card.ref_tok_s
    scale = step_s / sum(c * x for c, x in zip(parts, size.parts(curves)))
    anchor = Point("guide" if card.ref_measured else "guess", size, step_s,
                   GUIDE_NOISE if card.ref_measured else GUESS_NOISE)
    basis = ("the guide's measurement", "замера из гайда") if card.ref_measured else \
        ("the lab's rough guess", "грубой прикидки лабы")
    return Prior(card.name, card.precision, tuple(c * scale for c in parts), SHAPE_SPREAD["gpu"], anchor,
                 card.ref_measured, f"{basis[0]} on {card.name} at the reference size",
                 f"{basis[1]} на {card.name} для эталонного размера", curves=curves, shape=shape)


def cpu_threads() -> int:
    """The threads `lab train` trains on here: OMP_NUM_THREADS when set (torch takes it), else
    the cores this process may run on (torch's own default on the machines seen: one per core)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        pass
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cpu_parts(precision: str, threads: int) -> tuple[tuple[float, ...], int]:
    """The parts on `threads`, and the thread count they were measured on: that count's own
    where bench_prior measured it, else the nearest one below (or the fewest) with its parallel
    parts spread over `threads` as if they split evenly (a guess: a measured run corrects it)."""
    if threads in CPU_PARTS:
        return CPU_PARTS[threads][precision], threads
    below = [t for t in CPU_PARTS if t < threads]
    base = max(below) if below else min(CPU_PARTS)
    factor = base / threads
    parts = tuple(c * factor if i < CPU_PARALLEL_PARTS else c for i, c in enumerate(CPU_PARTS[base][precision]))
    return parts, base


def _cpu_prior(card: Card, precision: str, threads: int) -> Prior:
    """This CPU's parts on `threads`, anchored at the reference size with a wide noise: another
    processor's speed is a guess until a run here measures it."""
    parts, base = cpu_parts(precision, threads)
    size = reference_size(card)
    anchor = Point("guess", size, sum(c * x for c, x in zip(parts, size.parts())), CPU_ANCHOR_NOISE)
    where, where_ru = CPU_MEASURED_ON[base]
    scaled = "" if base == threads else f", scaled from {base} thread(s)"
    scaled_ru = "" if base == threads else f", пересчёт с потоков: {base}"
    unsteady = unsteady_local(precision, threads)
    aside = (f"; this computer's own parts, measured on {unsteady.at[:10]}, are not used: {unsteady.why_unsteady()}, "
             f"and `lab size --measure-parts` measures them again" if unsteady else "")
    aside_ru = (f"; собственные части этого компьютера от {unsteady.at[:10]} не используются: "
                f"{unsteady.why_unsteady('ru')}, а `lab size --measure-parts` измерит их снова" if unsteady else "")
    note = (f"the lab's rough guess for {threads} CPU thread(s) in {precision} (measured on {base} thread(s) of "
            f"{where}{scaled}; yours may differ 3× either way: a short run here measures it{aside})")
    note_ru = (f"грубой прикидки лабы для {threads} потоков CPU в {precision} (замер на {where_ru}, потоков: "
               f"{base}{scaled_ru}; ваш может отличаться втрое в любую сторону: короткий прогон здесь измерит его"
               f"{aside_ru})")
    return Prior("cpu", precision, parts, SHAPE_SPREAD["cpu"], anchor, False, note, note_ru, threads=threads,
                 run_noise=CPU_RUN_NOISE)


# The sum of a machine's measured parts against a whole step of the lab's model there: the parts
# leave out what a step does besides them and time their stand-ins apart, so their sum says the
# shape better than the level. On the 2-vCPU EPYC VM on one thread, busy, 2026-12-03: the sum was
# 16-61% above nine sizes' steps (scripts/bench_estimates.py --parts-check). A measured run sets it.
PARTS_ANCHOR_NOISE = 0.4


def _measured_cpu_prior(card: Card, precision: str, threads: int, shape: Shape) -> Prior:
    """This computer's own parts on `threads`, anchored at the reference size by their own sum with
    a wide noise: the parts set the shape, a measured run the level."""
    size = reference_size(card)
    anchor = Point("parts", size, sum(c * x for c, x in zip(shape.parts, size.parts(shape.curves))),
                   PARTS_ANCHOR_NOISE)
    note = f"{shape.note} in {precision}, summed at the reference size (a short run here measures the level)"
    note_ru = f"{shape.note_ru} в {precision}, сумма для эталонного размера (короткий прогон здесь измерит уровень)"
    return Prior("cpu", precision, shape.parts, SHAPE_SPREAD["cpu"], anchor, False, note, note_ru, threads=threads,
                 run_noise=CPU_RUN_NOISE, curves=shape.curves, shape=shape)
