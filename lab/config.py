"""The run's fields, defined once: `RunConfig`, its defaults (the guide's current values), the
values a field allows, and the checks that need nothing but the fields.

`RunConfig` is what `lab train` reads from flags or a JSON file, what the training notebook's
`parameters` cell holds, and what the "New run" form edits; the commands' flags, the notebook's
parameters and the form's widgets are all generated from it, with each field's words (labels and
help in English and Russian) from `lab.fields`. This module is stdlib-only: the training notebook
runs it on a bare Kaggle image.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

MODEL_FIELDS = ("context", "width", "heads", "layers")
# Where a session runs and what it reads, not how the run trains: a resumed run never takes these
# from its checkpoint (another machine has other paths).
SESSION_FIELDS = ("resume_from", "machine", "data_dir")
SCHEDULES = ("wsd", "cosine", "linear", "inv_sqrt")
PARALLEL_MODES = ("auto", "ddp", "dp", "none")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
GPUS = ("auto", "2xT4", "T4", "rtx3050", "cpu")
COMPILE_MODES = ("auto", "on", "off")
def _f(default: Any, **meta: Any) -> Any:
    """A field with its default and, optionally, `choices` (the values allowed: `check` enforces
    them, the form offers them). What each surface says about it is `lab.fields.WORDS`'."""
    kw = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(metadata=meta, **kw)


@dataclass(frozen=True)
class RunConfig:
    """A run's fields, frozen: a changed run is a new one (`dataclasses.replace`)."""
    # Run and checkpoint
    resume_from: str = _f("")  # a checkpoint file or a run folder to continue from; empty: from scratch
    constellations: list = _f(["pydoc"])  # the groups of datasets the text comes from
    # Model (locked when continuing from a checkpoint)
    context: int = _f(1024)  # tokens the model sees at once (n)
    width: int = _f(512)  # the vector per token (d)
    heads: int = _f(8)  # attention heads; width divides by them
    layers: int = _f(8)  # depth
    # Training
    gpu: str = _f("auto", choices=GPUS)  # the cards the run is sized for
    machine: str = _f("auto")  # where it runs: auto, local, an account, a box
    batch_per_card: int = _f(6)  # sequences of n tokens per card per step
    grad_accum: int = _f(1)  # micro-steps per optimizer step
    steps_until: int = _f(45000)  # the step training ends at; the schedule decays towards it
    limit_min: float = _f(630)  # minutes a session may train (its machine may allow a link less), then save
    # More
    schedule: str = _f("wsd", choices=SCHEDULES)  # the learning rate by step
    lr: float = _f(1e-3)  # the peak learning rate
    warmup_steps: int = _f(200)  # steps of warm-up to the peak
    decay_frac: float = _f(0.2)  # wsd, inv_sqrt: the final share of steps that decays
    decay_start: int = _f(0)  # wsd, inv_sqrt: the step the decay begins at; 0: from decay_frac
    min_lr_frac: float = _f(0.1)  # the rate at steps_until, as a share of lr
    rewarm_at: int = _f(0)  # a grown run's step where its rate rises again (lab.settle.grow); 0: none
    rewarm_steps: int = _f(0)  # steps of that re-warm
    rewarm_from_frac: float = _f(0.0)  # its first rate, as a share of lr
    weight_decay: float = _f(0.1)  # AdamW's, on matrices only
    grad_clip: float = _f(1.0)  # gradient norm clipping; 0: off
    seed: int = _f(1337)
    eval_every: int = _f(250)  # steps between val evaluations
    eval_batches: int = _f(20)  # batches per val evaluation
    log_every: int = _f(1)  # steps between metrics rows
    checkpoint_every_min: float = _f(20)  # minutes between periodic checkpoints
    parallel: str = _f("auto", choices=PARALLEL_MODES)  # several cards: DDP under torchrun, DataParallel, or one
    precision: str = _f("auto", choices=PRECISIONS)  # auto: bf16 from compute capability 8.0, else fp16
    torch_compile: str = _f("auto", choices=COMPILE_MODES)  # a compile that fails trains on uncompiled
    data_dir: str = _f("")  # the prepared data folder; empty: found from the constellations

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        unknown = sorted(set(values) - set(field_names()))
        if unknown:
            raise ConfigError([Problem(unknown[0], f"unknown field(s): {', '.join(unknown)}",
                                       f"неизвестные поля: {', '.join(unknown)}")])
        return cls(**{name: coerce(name, value) for name, value in values.items()})

    @classmethod
    def from_json_file(cls, path: str) -> "RunConfig":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def model_dict(self) -> dict:
        return {k: getattr(self, k) for k in MODEL_FIELDS}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]


def field_choices(name: str) -> tuple[str, ...] | None:
    """The values a field allows, when it is one of a few names (schedule, gpu, ...)."""
    return next(f.metadata.get("choices") for f in dataclasses.fields(RunConfig) if f.name == name)


def field_kind(name: str) -> str:
    """The field's declared type as a word: "int", "float", "str" or "list"."""
    kind = next(f.type for f in dataclasses.fields(RunConfig) if f.name == name)
    return kind if isinstance(kind, str) else kind.__name__


def coerce(name: str, value: Any) -> Any:
    """Turns a value from a flag, a JSON file or a widget into the field's declared type."""
    kind = field_kind(name)
    try:
        if kind == "list":
            return [str(v) for v in (value.split(",") if isinstance(value, str) else value) if str(v)]
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind == "float":
            return float(value)
        return "" if value is None else str(value)
    except (TypeError, ValueError):
        raise ConfigError([Problem(name, f"{name}: {value!r} is not a valid {kind}",
                                   f"{name}: {value!r} — неверное значение ({kind})")]) from None


@dataclass
class Problem:
    """One thing wrong with a run's fields, said in both of the lab's languages."""
    field: str
    en: str
    ru: str
    severity: str = "error"  # or "warning"; or "note": what the lab does about it, said beside the field

    def message(self, lang: str = "en") -> str:
        return self.ru if lang == "ru" else self.en


class UserError(Exception):
    """Bad input the person can fix: the CLI prints it as one line and exits 2, no traceback.
    `ru`: the same message in Russian, where the raiser gives one (the control notebook speaks
    Russian by default; `str(e)` stays the English)."""

    def __init__(self, *args: object, ru: str | None = None):
        super().__init__(*args)
        self.ru = ru


class ConfigError(UserError, ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(p.en for p in problems), ru="; ".join(p.ru for p in problems))


def check(cfg: RunConfig) -> list[Problem]:
    """Problems that need nothing but the fields themselves. Data- and checkpoint-aware
    checks (context against the val split, locked fields, steps_until against the
    checkpoint's step) live where that knowledge is: `check_against_data`,
    `check_resume`; the limit against Kaggle's session, `lab.kaggle.limits`."""
    out: list[Problem] = []
    for name in ("context", "width", "heads", "layers", "batch_per_card", "grad_accum", "steps_until",
                 "eval_every", "eval_batches", "log_every"):
        v = getattr(cfg, name)
        if v < 1:
            out.append(Problem(name, f"{name} must be at least 1 (got {v})",
                               f"{name} должно быть не меньше 1 (сейчас {v})"))
    if cfg.width >= 1 and cfg.heads >= 1 and cfg.width % cfg.heads:
        out.append(Problem("heads", f"width {cfg.width} does not divide by heads {cfg.heads}: "
                                    f"pick heads among {divisors(cfg.width)}",
                           f"ширина {cfg.width} не делится на головы {cfg.heads}: "
                           f"подойдут {divisors(cfg.width)}"))
    if cfg.limit_min <= 0:
        out.append(Problem("limit_min", f"limit_min must be positive (got {cfg.limit_min})",
                           f"лимит должен быть больше нуля (сейчас {cfg.limit_min})"))
    if not cfg.constellations and not cfg.data_dir:
        out.append(Problem("constellations", "choose at least one constellation",
                           "выберите хотя бы одно созвездие"))
    if cfg.lr <= 0:
        out.append(Problem("lr", f"lr must be positive (got {cfg.lr})", f"lr должна быть больше нуля ({cfg.lr})"))
    for name in field_names():
        allowed = field_choices(name)
        if allowed and getattr(cfg, name) not in allowed:
            out.append(Problem(name, f"{name} must be one of {', '.join(allowed)} (got {getattr(cfg, name)!r})",
                               f"{name}: допустимо {', '.join(allowed)} (сейчас {getattr(cfg, name)!r})"))
    if cfg.decay_start < 0:
        out.append(Problem("decay_start", f"decay_start must be 0 or a step (got {cfg.decay_start})",
                           f"decay_start должен быть 0 или номером шага (сейчас {cfg.decay_start})"))
    if cfg.rewarm_at < 0 or cfg.rewarm_steps < 0 or not 0 <= cfg.rewarm_from_frac <= 1:
        out.append(Problem("rewarm_at", "rewarm_*: steps of 0 or more, a fraction in [0, 1]",
                           "rewarm_*: шаги от 0, доля от 0 до 1"))
    if not 0 <= cfg.decay_frac <= 1 or not 0 <= cfg.min_lr_frac <= 1:
        out.append(Problem("decay_frac", "decay_frac and min_lr_frac must lie in [0, 1]",
                           "decay_frac и min_lr_frac должны быть от 0 до 1"))
    return out


def check_against_data(cfg: RunConfig, shortest_split_tokens: int) -> list[Problem]:
    """The context must fit in the data's shortest split (a val window is context + 1 tokens)."""
    if cfg.context + 1 > shortest_split_tokens:
        return [Problem("context", f"context {cfg.context} is longer than the data's shortest split "
                                   f"({shortest_split_tokens} tokens): lower context below {shortest_split_tokens}",
                        f"контекст {cfg.context} длиннее самой короткой части данных ({shortest_split_tokens} "
                        f"токенов): уменьшите контекст")]
    return []


def check_resume(cfg: RunConfig, ckpt_config: dict, ckpt_step: int, given: set[str] | None = None) -> list[Problem]:
    """A continued run keeps the checkpoint's architecture (the model fields are locked) and
    must end after the checkpoint's step. `given` names the fields the person set
    explicitly; a model field given with another value than the checkpoint's is an error."""
    out = []
    for name in MODEL_FIELDS:
        mine, theirs = getattr(cfg, name), ckpt_config.get(name)
        if (given is None or name in given) and mine != theirs:
            out.append(Problem(name, f"{name} is locked when continuing: the checkpoint has {name}={theirs}, "
                                     f"the run asks for {mine}; weights of another shape will not fit",
                               f"{name} закрыто при продолжении: у чекпоинта {theirs}, а задано {mine}; "
                               f"веса другой формы не лягут"))
    if cfg.steps_until <= ckpt_step:
        out.append(Problem("steps_until", f"steps_until {cfg.steps_until} is not above the checkpoint's step "
                                          f"{ckpt_step}: raise it to continue",
                           f"«Шагов до» {cfg.steps_until} не больше шага чекпоинта {ckpt_step}: увеличьте"))
    return out


def raise_on_errors(problems: list[Problem]) -> list[Problem]:
    """Raises ConfigError when any problem is an error; returns the warnings."""
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ConfigError(errors)
    return problems


def weight_count(layers: int, width: int, vocab: int, context: int) -> int:
    """The guide's formula, exact for this GPT: 12·layers·d² + vocab·d + n·d (per block q, k, v,
    out and the 4·d MLP; no biases, norms without weights, the head tied to the embedding)."""
    return 12 * layers * width * width + vocab * width + context * width


def flops_per_token(layers: int, width: int, vocab: int, context: int) -> float:
    """Training FLOPs per token: 6·N for the matrix products forward and backward, plus
    12·layers·n·d for attention's scores and weighted sums (PaLM's accounting)."""
    return 6 * weight_count(layers, width, vocab, context) + 12 * layers * context * width


def card_set(name: str, cards: int = 1) -> str:
    """The lab's name for a card set, as the `gpu` field and the calculator name them: "2xT4",
    "T4", "rtx3050", "cpu"; another card keeps its own name ("2xNVIDIA H100" for two)."""
    name = name.strip()
    short = "cpu" if name.lower() == "cpu" else "T4" if "T4" in name else "rtx3050" if "3050" in name else name
    return f"{cards}x{short}" if cards > 1 and short != "cpu" else short


def divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]
