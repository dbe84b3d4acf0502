"""The run's fields, defined once.

`RunConfig` is what `lab train` reads from flags or a JSON file, what the training
notebook's `parameters` cell holds, and what the "New run" form edits. The defaults are
the guide's current values. This module is stdlib-only: it is pasted into the training
notebook that runs on a bare Kaggle image.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

MODEL_FIELDS = ("context", "width", "heads", "layers")
SCHEDULES = ("wsd", "cosine", "linear", "inv_sqrt")
PARALLEL_MODES = ("auto", "ddp", "dp", "none")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
COMPILE_MODES = ("auto", "on", "off")
GPUS = ("auto", "2xT4", "T4", "rtx3050", "cpu")
KAGGLE_SESSION_MIN = 720  # Kaggle ends a batch GPU session after 12 hours.
LIMIT_WARN_MIN = 690


def _f(default: Any, help_en: str, help_ru: str, **meta: Any) -> Any:
    """A field with its help texts (English and the guide's Russian) as metadata."""
    kw = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(metadata={"en": help_en, "ru": help_ru, **meta}, **kw)


@dataclass
class RunConfig:
    # Run and checkpoint
    resume_from: str = _f("", "Checkpoint file or run folder to continue from; empty for a run from scratch.",
                          "Файл чекпоинта или папка прогона, с которого продолжить; пусто — прогон с нуля.")
    constellations: list = _f(["pydoc"], "Named groups of text sources the training text comes from.",
                              "Из каких групп датасетов берётся текст.")
    # Model (locked when continuing from a checkpoint)
    context: int = _f(1024, "Context n: tokens the model sees at once.", "Контекст n: сколько токенов модель видит за раз.")
    width: int = _f(512, "Width d: the vector per token.", "Ширина d: длина вектора, которым модель описывает токен.")
    heads: int = _f(8, "Heads: parallel views of attention; width must divide by heads.",
                    "Головы: на сколько «взглядов» делится внимание; d делится на головы без остатка.")
    layers: int = _f(8, "Layers: depth.", "Слои: глубина.")
    # Training
    gpu: str = _f("auto", "The card(s) the run is sized for: auto, 2xT4, T4, rtx3050, cpu.",
                  "Видеокарта: auto, 2xT4, T4, rtx3050, cpu.")
    machine: str = _f("auto", "Where it runs: auto, local, or a Kaggle account name.",
                      "Машина: «авто», эта машина или аккаунт Kaggle.")
    batch_per_card: int = _f(6, "Batch per card: chunks of n tokens each card processes per step.",
                             "Батч на карту: сколько кусков по n токенов карта обрабатывает за шаг.")
    grad_accum: int = _f(1, "Micro-steps accumulated into one optimizer step.",
                         "Сколько микрошагов копить в один шаг оптимизатора.")
    steps_until: int = _f(45000, "The step at which training ends; the learning rate decays towards it.",
                          "Номер шага, на котором обучение закончится; к нему плавно падает скорость обучения.")
    limit_min: float = _f(630, "Minutes allotted; at the limit training saves a checkpoint and stops.",
                          "Сколько минут отвести; по лимиту обучение сохранит чекпоинт и остановится.")
    # More
    schedule: str = _f("wsd", "Learning-rate schedule: wsd, cosine, linear, inv_sqrt.",
                       "Расписание скорости обучения: wsd, cosine, linear, inv_sqrt.")
    lr: float = _f(1e-3, "Peak learning rate.", "Пиковая скорость обучения.")
    warmup_steps: int = _f(200, "Linear warmup steps (at most a tenth of steps_until).",
                           "Шаги разогрева (не больше десятой части «Шагов до»).")
    decay_frac: float = _f(0.2, "WSD and inv_sqrt: the final fraction of steps over which the rate decays.",
                           "WSD и inv_sqrt: доля последних шагов, на которых скорость спадает.")
    min_lr_frac: float = _f(0.1, "The rate at steps_until, as a fraction of lr.",
                            "Скорость на последнем шаге, как доля от lr.")
    weight_decay: float = _f(0.1, "AdamW weight decay (matrices only).", "Затухание весов AdamW (только матрицы).")
    grad_clip: float = _f(1.0, "Gradient norm clipping; 0 turns it off.", "Обрезка нормы градиента; 0 — выключить.")
    seed: int = _f(1337, "Random seed.", "Зерно случайности.")
    eval_every: int = _f(250, "Steps between val evaluations (and text samples).",
                         "Шагов между оценками на val (и примерами текста).")
    eval_batches: int = _f(20, "Batches per val evaluation.", "Батчей на одну оценку val.")
    log_every: int = _f(1, "Steps between lines of metrics.jsonl.", "Шагов между строками metrics.jsonl.")
    checkpoint_every_min: float = _f(20, "Minutes between periodic checkpoints.", "Минут между чекпоинтами.")
    parallel: str = _f("auto", "Several cards: auto (DDP under torchrun), ddp, dp (DataParallel), none.",
                       "Несколько карт: auto, ddp, dp (DataParallel), none.")
    precision: str = _f("auto", "auto: bf16 from compute capability 8.0 on, fp16 with GradScaler below it, fp32 on CPU.",
                        "auto: bf16 на картах от 8.0, fp16 с GradScaler ниже, fp32 на CPU.")
    torch_compile: str = _f("auto", "torch.compile the model: auto (on a GPU; on CPU when a C++ compiler is found and the "
                              "run is long enough to repay the compile time), on, off. If compiling fails, "
                              "training goes on uncompiled.",
                      "torch.compile для модели: auto (на GPU; на CPU — если есть компилятор C++ и прогон "
                      "достаточно длинный, чтобы окупить компиляцию), on, off. Если компиляция не удалась, "
                      "обучение идёт без неё.")
    data_dir: str = _f("", "Prepared data folder (shards, tokenizer, manifest); empty: found from constellations.",
                       "Папка подготовленных данных; пусто — найти по созвездиям.")

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
        cfg = cls()
        for name, value in values.items():
            setattr(cfg, name, coerce(name, value))
        return cfg

    @classmethod
    def from_json_file(cls, path: str) -> "RunConfig":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def model_dict(self) -> dict:
        return {k: getattr(self, k) for k in MODEL_FIELDS}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]


def field_help(name: str, lang: str = "en") -> str:
    return next(f.metadata[lang] for f in dataclasses.fields(RunConfig) if f.name == name)


def coerce(name: str, value: Any) -> Any:
    """Turns a value from a flag, a JSON file or a widget into the field's declared type."""
    kind = next(f.type for f in dataclasses.fields(RunConfig) if f.name == name)
    kind = kind if isinstance(kind, str) else kind.__name__
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
    severity: str = "error"  # or "warning"

    def message(self, lang: str = "en") -> str:
        return self.ru if lang == "ru" else self.en


class UserError(Exception):
    """Bad input the person can fix: the CLI prints it as one line and exits 2, no traceback."""


class ConfigError(UserError, ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(p.en for p in problems))


def check(cfg: RunConfig) -> list[Problem]:
    """Problems that need nothing but the fields themselves. Data- and checkpoint-aware
    checks (context against the val split, locked fields, steps_until against the
    checkpoint's step) live where that knowledge is: `check_against_data`,
    `check_resume`."""
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
    elif cfg.limit_min > KAGGLE_SESSION_MIN and cfg.machine != "local":
        out.append(Problem("limit_min", f"limit_min {cfg.limit_min:g} is above Kaggle's 12-hour session "
                                        f"({KAGGLE_SESSION_MIN} min): the session would be killed before the checkpoint",
                           f"лимит {cfg.limit_min:g} мин больше 12-часовой сессии Kaggle ({KAGGLE_SESSION_MIN} мин): "
                           f"сессию убьют раньше чекпоинта"))
    elif cfg.limit_min > LIMIT_WARN_MIN and cfg.machine != "local":
        out.append(Problem("limit_min", f"limit_min {cfg.limit_min:g} leaves little margin before Kaggle's "
                                        f"12-hour limit; the lab uses 630",
                           f"лимит {cfg.limit_min:g} мин оставляет мало запаса до 12 часов Kaggle; лаба берёт 630",
                           severity="warning"))
    if not cfg.constellations and not cfg.data_dir:
        out.append(Problem("constellations", "choose at least one constellation",
                           "выберите хотя бы одно созвездие"))
    if cfg.lr <= 0:
        out.append(Problem("lr", f"lr must be positive (got {cfg.lr})", f"lr должна быть больше нуля ({cfg.lr})"))
    for name, allowed in (("schedule", SCHEDULES), ("parallel", PARALLEL_MODES), ("precision", PRECISIONS),
                          ("gpu", GPUS), ("torch_compile", COMPILE_MODES)):
        if getattr(cfg, name) not in allowed:
            out.append(Problem(name, f"{name} must be one of {', '.join(allowed)} (got {getattr(cfg, name)!r})",
                               f"{name}: допустимо {', '.join(allowed)} (сейчас {getattr(cfg, name)!r})"))
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


def card_set(name: str, cards: int = 1) -> str:
    """The lab's name for a card set, as the `gpu` field and the calculator name them: "2xT4",
    "T4", "rtx3050", "cpu"; another card keeps its own name ("2xNVIDIA H100" for two)."""
    name = name.strip()
    short = "cpu" if name.lower() == "cpu" else "T4" if "T4" in name else "rtx3050" if "3050" in name else name
    return f"{cards}x{short}" if cards > 1 and short != "cpu" else short


def divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]
