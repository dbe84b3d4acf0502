"""The sizing calculator and the one place a run's fields are validated.

The "New run" form calls `estimate` on every keystroke and `lab size` prints it, so this
package is stdlib-only and answers in about a millisecond once warm: files it reads
(data manifests, checkpoint sidecars, the lab's measured runs) are cached by mtime, and a
live run's metrics.jsonl is read incrementally.

Figures say where they come from (`kind`):
- "exact": arithmetic on the fields (weights, tokens per step) or counted (data tokens);
- "measured": a measurement at exactly this size and card (the guide's, or the lab's runs);
- "calibrated": the card's step-time model fitted to the lab's own runs at other sizes;
- "estimate": the card's model scaled from the guide's reference measurement or the lab's
  guess (a CPU, the RTX 3050), or a formula (memory);
- "unknown": not computable now (no prepared data, bad fields).

By concern: `cards` (the cards, the reference size, weights and FLOPs), `memory`,
`inputs` (manifests and checkpoints the calculator reads), `speeds` (the lab's measured
speeds), `steptime` (a step's time as a sum of parts, and its fit), `machine` (a machine's parts
as its short microbenchmark measured them: the model's shape), `priors` (each card's parts: its
measured ones, else the lab's prior), `speedmodel` (the one place a speed comes from), `runtime`
(a whole run's time and what sessions spend besides steps), `calibration` (each run's
prediction against its measurement), `figures`, `estimate`, `checks` (validation), `law` (the
recipe lab's fitted L(N, D) as the calculator reads it, predictions with their intervals), `grow`
(when to grow), `words` (numbers in Russian and English).

Entry points: `estimate(cfg) -> Estimate`, `validate(cfg) -> list[Problem]`,
`when_to_grow(metrics, manifest, cfg) -> Verdict`.
"""
from __future__ import annotations

from lab.sizing.cards import (AUTO_GPU, CARD_WHERE, CARDS, DEFAULT_VOCAB, REFERENCE, STARTUP_MIN, TOKENS_PER_WEIGHT,
                              Card, card_for, flops_per_token, next_size, weight_count)
from lab.sizing.estimate import estimate, validate
from lab.sizing.figures import Estimate, Figure
from lab.sizing.grow import Verdict, when_to_grow
from lab.sizing.inputs import checkpoint_info, find_manifest, tokens_available
from lab.sizing.memory import GB, Memory, host_memory_bytes, max_batch, memory_bytes, usable_bytes
from lab.sizing.runtime import EVAL_FORWARD_SHARE, SessionCosts, kaggle_session_costs
from lab.sizing.speedmodel import SpeedModel, size_of, slowdown, speed_model
from lab.sizing.speeds import SOURCES, TAIL_BYTES, WARMUP_STEPS, Measured, measured_runs
from lab.sizing.steptime import PARTS, Point, Size
from lab.sizing.words import KIND_RU, format_count, format_hours, format_number

__all__ = ["AUTO_GPU", "CARD_WHERE", "CARDS", "DEFAULT_VOCAB", "EVAL_FORWARD_SHARE", "GB", "KIND_RU", "PARTS",
           "REFERENCE", "SOURCES", "STARTUP_MIN", "TAIL_BYTES", "TOKENS_PER_WEIGHT", "WARMUP_STEPS", "Card", "Estimate",
           "Figure", "Measured", "Memory", "Point", "SessionCosts", "Size", "SpeedModel", "Verdict", "card_for", "checkpoint_info",
           "estimate", "find_manifest", "flops_per_token", "format_count", "format_hours", "format_number",
           "host_memory_bytes", "kaggle_session_costs", "max_batch", "measured_runs", "memory_bytes", "next_size",
           "size_of", "slowdown", "speed_model", "tokens_available", "usable_bytes", "validate", "weight_count", "when_to_grow"]
