"""The cards a run can be sized for, the guide's reference size and the size arithmetic
(weights, FLOPs per token, the next size up)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from lab.config import RunConfig, cpu_precision, flops_per_token, weight_count  # noqa: F401 (the calculator's names)

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


def rate_known(card: Card, precision: str) -> bool:
    """Whether the card's prior speaks for `precision` (else it is the card's own precision's:
    bf16 on a T4 is emulated, fp16 on a CPU is not what the loop trains in)."""
    return precision == card.precision or (card.name == "cpu" and precision in ("fp32", "bf16"))


def next_size(cfg: RunConfig) -> RunConfig:
    """The next size up, the guide's step: half as many layers again (8 -> 12)."""
    return replace(cfg, layers=cfg.layers + max(1, cfg.layers // 2))

