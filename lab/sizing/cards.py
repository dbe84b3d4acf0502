"""The cards a run can be sized for, the guide's reference size and the size arithmetic
(weights, FLOPs per token, the next size up)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from lab.config import RunConfig, flops_per_token, weight_count  # noqa: F401 (the calculator's names
from lab.kernel.cpu import cpu_precision
from lab.home import machines_dir

DEFAULT_VOCAB = 4000  # the lab's tokenizer, when no manifest or checkpoint says otherwise
TOKENS_PER_WEIGHT = 20  # the guide's "about 20 tokens of data per weight"
# The size at which the guide measured its speeds (and the form's defaults).
REFERENCE = {"context": 1024, "width": 512, "heads": 8, "layers": 8, "vocab": 4000, "batch_per_card": 6}
AUTO_GPU = "2xT4"  # "auto" sizes for Kaggle's machine: the Auto rule picks a Kaggle account first
STARTUP_MIN = 10.0  # a Kaggle session's start, data mount and the final checkpoint save


@dataclass(frozen=True)
class Card:
    """A card (or pair of cards) a run can be sized for."""
    name: str
    cards: int
    usable_gb: float | None  # per card; None: host memory, read on first use
    precision: str  # what precision "auto" picks on it
    ref_tok_s: float  # at REFERENCE, all cards together (the CPU's: lab.sizing.priors)
    ref_measured: bool  # the guide measured ref_tok_s; otherwise it is our estimate
    kaggle: bool  # runs on Kaggle and spends an account's weekly quota
    context_gb: float  # CUDA context and cuBLAS workspaces, outside PyTorch's allocator


# How memory messages name the card: (English, Russian).
CARD_WHERE = {"2xT4": ("each T4", "на каждой T4"), "T4": ("a T4", "на T4"), "rtx3050": ("an RTX 3050", "на RTX 3050"),
              "cpu": ("this computer", "на этом компьютере")}

CARDS = {
    "2xT4": Card("2xT4", 2, 15.0, "fp16", 102_000.0, True, True, 0.5),
    "T4": Card("T4", 1, 15.0, "fp16", 49_000.0, True, True, 0.5),
    # Not measured. The guide: "slower than one T4". Its bf16 tensor rate with fp32
    # accumulation (~18 TFLOPS) and 224 GB/s put it near 0.7 of a power-capped T4.
    "rtx3050": Card("rtx3050", 1, 8.0, "bf16", 34_000.0, False, False, 0.5),
    "cpu": Card("cpu", 1, None, cpu_precision(), 0.0, False, False, 0.0),
}


BOX_HEADROOM_GB = 0.5  # what a box's desktop or other processes keep of each card's memory


def card_for(gpu: str | None) -> Card | None:
    """The calculator's card for a `gpu` value: one the guide names (CARDS), or the card set one
    of the lab's boxes measured in its check (`lab machines check`); None: no figures for it."""
    if gpu in CARDS:
        return CARDS[gpu]
    return checked_cards().get(gpu) if gpu else None


def checked_cards() -> dict[str, Card]:
    """The card sets the lab's boxes measured, by the `gpu` name their check gave them: the
    memory of the smallest card, bf16 from compute capability 8.0 (Ampere) on, and the check's
    burst at the reference size as the speed."""
    out = {}
    for record in _box_checks():
        cards, tok_s = record.get("cards") or [], record.get("tok_s")
        if not cards or not tok_s or record.get("gpu") in (None, "cpu") or record["gpu"] in CARDS:
            continue
        capability = min(float(c.get("capability") or 0) for c in cards)
        usable = min(float(c.get("memory_gb") or 0) for c in cards) - BOX_HEADROOM_GB
        out[record["gpu"]] = Card(record["gpu"], sum(int(c.get("count") or 1) for c in cards), max(usable, 0.5),
                                  "bf16" if capability >= 8.0 else "fp16", float(tok_s), True, False, 0.5)
    return out


def _box_checks() -> list[dict]:
    try:
        entries = list(os.scandir(machines_dir()))
    except OSError:
        return []
    out = []
    for entry in entries:
        try:
            with open(os.path.join(entry.path, "check.json"), encoding="utf-8") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


def card_where(card: Card) -> tuple[str, str]:
    """How memory messages name the card, (English, Russian): "each T4", or a box's own card."""
    if card.name in CARD_WHERE:
        return CARD_WHERE[card.name]
    one = card.name.split("x", 1)[1] if card.cards > 1 and "x" in card.name else card.name
    return (f"each {one}", f"на каждой {one}") if card.cards > 1 else (f"the {one}", f"на {one}")


def rate_known(card: Card, precision: str) -> bool:
    """Whether the card's prior speaks for `precision` (else it is the card's own precision's:
    bf16 on a T4 is emulated, fp16 on a CPU is not what the loop trains in)."""
    return precision == card.precision or (card.name == "cpu" and precision in ("fp32", "bf16"))


def next_size(cfg: RunConfig) -> RunConfig:
    """The next size up, the guide's step: half as many layers again (8 -> 12)."""
    return replace(cfg, layers=cfg.layers + max(1, cfg.layers // 2))

