"""The run's fields, defined once.

`RunConfig` is what `lab train` reads from flags or a JSON file, what the training
notebook's `parameters` cell holds, and what the "New run" form edits. Each field carries
its label and help in English and Russian (the guide's words), its choices and its flag:
the commands' flags (`flag_specs`), the notebook's parameters and the form's widgets are
all generated from this one definition. The defaults are
the guide's current values. This module is stdlib-only: it is pasted into the training
notebook that runs on a bare Kaggle image.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

MODEL_FIELDS = ("context", "width", "heads", "layers")
# Where a session runs and what it reads, not how the run trains: a resumed run never takes these
# from its checkpoint (another machine has other paths).
SESSION_FIELDS = ("resume_from", "machine", "data_dir")
SCHEDULES = ("wsd", "cosine", "linear", "inv_sqrt")
PARALLEL_MODES = ("auto", "ddp", "dp", "none")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
GPUS = ("auto", "2xT4", "T4", "rtx3050", "cpu")
COMPILE_MODES = ("auto", "on", "off")
KAGGLE_SESSION_MIN = 720  # Kaggle ends a batch GPU session after 12 hours.
# The push asks a session timeout "lower than the global maximum" (kagglesdk's SaveKernel request),
# a minute below the 12 hours, and keeps at least this floor between it and the notebook's own
# limit (boot, the final save, the output copy): no run's limit_min on Kaggle may be above the rest.
KAGGLE_TIMEOUT_MAX_S = KAGGLE_SESSION_MIN * 60 - 60
KAGGLE_MARGIN_FLOOR_MIN = 10.0
KAGGLE_LIMIT_MAX_MIN = KAGGLE_TIMEOUT_MAX_S / 60 - KAGGLE_MARGIN_FLOOR_MIN
LIMIT_WARN_MIN = 690


def _f(default: Any, help_en: str, help_ru: str, *, label: tuple[str, str], **meta: Any) -> Any:
    """A field with what every surface says about it, English first, then Russian: its help
    (the guide's words; the form shows it under the field, the commands in --help, the
    notebook beside the parameter), its label (the form's), and optionally `choices` (the
    values allowed; `check` enforces them, the form offers them), `flags` and `metavar`."""
    kw = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(metadata={"label_en": label[0], "label_ru": label[1], "en": help_en, "ru": help_ru, **meta}, **kw)


@dataclass
class RunConfig:
    # Run and checkpoint
    resume_from: str = _f("",
        "A checkpoint file, or a run folder (its newest good checkpoint), to continue from; empty: from "
        "scratch. Training picks up the weights and the step number of the earlier run. The architecture "
        "is the checkpoint's: weights of another shape will not fit, so the model fields are locked.",
        "Обучение подхватывает веса и номер шага прошлого прогона. Архитектура при этом та же, что у "
        "чекпоинта: другой формы веса просто не лягут, поэтому поля модели закрыты.",
        label=("Continue from checkpoint", "Продолжить с чекпоинта"), flags=("--resume",), metavar="PATH")
    constellations: list = _f(["pydoc"],
        "Which groups of datasets the text comes from. New data means a new held-out set, so val starts "
        "counting again.",
        "Из каких групп датасетов берётся текст. Новые данные — новая отложенная выборка, поэтому val "
        "начинает счёт заново.",
        label=("Constellations in training", "Созвездия в обучении"), flags=("--constellation", "-c"), metavar="NAME")
    # Model (locked when continuing from a checkpoint)
    context: int = _f(1024,
        "Tokens the model sees at once. Longer holds a longer thought, but attention gets dearer: memory "
        "and time grow with n.",
        "Сколько токенов модель видит за раз. Длиннее — держит более длинную мысль, но внимание дорожает: "
        "память и время растут вместе с n.",
        label=("Context n", "Контекст n"))
    width: int = _f(512,
        "The length of the vector that describes each token. Weights grow as d²: doubling d gives about "
        "4× the weights.",
        "Длина вектора, которым модель описывает каждый токен. Веса растут как d²: удвоить d — примерно "
        "вчетверо больше весов.",
        label=("Width d", "Ширина d"))
    heads: int = _f(8,
        "How many parallel “views” attention is split into. d must divide by heads: 512 / 8 makes 64 per "
        "head, the usual size.",
        "На сколько параллельных «взглядов» делится внимание. d делится на головы без остатка: 512 / 8 = "
        "64 на голову, это обычная величина.",
        label=("Heads", "Головы"))
    layers: int = _f(8,
        "Depth: how many times in a row the model reworks the text. Weights and time grow almost "
        "linearly: 12 layers are about 1.5× bigger and slower than 8.",
        "Глубина: сколько раз подряд модель перерабатывает текст. Веса и время растут почти линейно: 12 "
        "слоёв — примерно в полтора раза больше и медленнее, чем 8.",
        label=("Layers", "Слои"))
    # Training
    gpu: str = _f("auto",
        "2×T4 on Kaggle is twice as fast as one T4: about 102 thousand tokens/s against 49 thousand. An "
        "own RTX 3050 is slower than one T4 and runs hot.",
        "2×T4 на Kaggle вдвое быстрее одной T4: около 102 тыс. токенов в секунду против 49 тыс. Своя RTX "
        "3050 медленнее одной T4 и греется.",
        label=("GPU", "Видеокарта"), choices=GPUS)
    machine: str = _f("auto",
        "A Kaggle account with its own quota. “Auto” picks a free machine: first one whose quota covers "
        "the whole run, then one that already has the checkpoint and the data. If the quota runs out "
        "early, the lab continues training on another free machine.",
        "Аккаунт Kaggle со своей квотой. «Авто» выбирает свободную машину: сперва ту, где квоты хватит на "
        "весь прогон, потом ту, где уже есть чекпоинт и данные. Если квота кончилась раньше, лаба "
        "продолжит обучение на другой свободной машине.",
        label=("Machine", "Машина"))
    batch_per_card: int = _f(6,
        "Chunks of n tokens a card processes per step. A step on 2×T4 with batch 6 is 6 × 2 × 1024, or "
        "12,288 tokens. Bigger batch: smoother training, more memory. Failed with “CUDA out of memory”: "
        "lower the batch.",
        "Сколько кусков по n токенов карта обрабатывает за шаг. Шаг на 2×T4 с батчем 6 — это 6 × 2 × 1024 "
        "= 12 288 токенов. Больше батч — ровнее обучение, но больше памяти. Упало с «CUDA out of memory» "
        "— уменьшите батч.",
        label=("Batch per card", "Батч на карту"))
    grad_accum: int = _f(1,
        "Micro-steps accumulated into one optimizer step.",
        "Сколько микрошагов копить в один шаг оптимизатора.",
        label=("Gradient accumulation", "Накопление градиента"))
    steps_until: int = _f(45000,
        "The step at which training ends. It also sets the learning-rate schedule: the rate decays "
        "smoothly towards this step. Added data: raise it.",
        "Номер шага, на котором обучение закончится. Он же задаёт расписание скорости обучения: к этому "
        "шагу она плавно падает. Добавили данных — увеличьте.",
        label=("Steps until", "Шагов до"))
    limit_min: float = _f(630,
        "Minutes allotted. At the limit training stops by itself and saves a checkpoint, even if “Steps "
        "until” was not reached. 630 minutes leave a margin before Kaggle's session limit.",
        "Сколько минут отвести. По лимиту обучение само остановится и сохранит чекпоинт, даже если до "
        "«Шагов до» не дошло. 630 минут оставляют запас до лимита сессии Kaggle.",
        label=("Limit, min", "Лимит, мин"))
    # More
    schedule: str = _f("wsd",
        "How the learning rate changes with the step: wsd (warmup, stable, decay), cosine, linear, "
        "inv_sqrt (1/√t). A small rate at the end is what converges precisely.",
        "Как скорость обучения меняется по шагам: wsd (разогрев, ровно, спад), cosine, linear, inv_sqrt "
        "(1/√t). К концу нужна малая скорость, чтобы сойтись точно.",
        label=("Schedule", "Расписание"), choices=SCHEDULES)
    lr: float = _f(1e-3,
        "The peak learning rate. Higher fits each batch faster, but above a threshold the loss explodes.",
        "Пиковая скорость обучения. Больше — быстрее подгоняет каждый батч, но выше порога loss "
        "взрывается.",
        label=("Learning rate", "Скорость обучения"))
    warmup_steps: int = _f(200,
        "Steps over which the rate rises from zero to its peak (at most a tenth of “Steps until”).",
        "Шаги, за которые скорость растёт от нуля до пика (не больше десятой части «Шагов до»).",
        label=("Warmup steps", "Шагов разогрева"))
    decay_frac: float = _f(0.2,
        "WSD and inv_sqrt: the final fraction of steps over which the rate decays.",
        "WSD и inv_sqrt: доля последних шагов, на которых скорость спадает.",
        label=("Decay fraction", "Доля спада"))
    decay_start: int = _f(0,
        "WSD and inv_sqrt: the step where the decay begins; 0: from decay_frac. A cooldown branch sets it "
        "to the step it branches from.",
        "WSD и inv_sqrt: шаг, с которого скорость начинает спадать; 0 — по decay_frac. Ветка охлаждения "
        "ставит сюда шаг, от которого она ответвилась.",
        label=("Decay from step", "Спад с шага"))
    min_lr_frac: float = _f(0.1,
        "The rate at steps_until, as a fraction of lr.",
        "Скорость на последнем шаге, как доля от lr.",
        label=("Final rate fraction", "Конечная доля скорости"))
    weight_decay: float = _f(0.1,
        "AdamW weight decay (matrices only).",
        "Затухание весов AdamW (только матрицы).",
        label=("Weight decay", "Затухание весов"))
    grad_clip: float = _f(1.0,
        "Gradient norm clipping; 0 turns it off.",
        "Обрезка нормы градиента; 0 — выключить.",
        label=("Gradient clipping", "Обрезка градиента"))
    seed: int = _f(1337,
        "Random seed.",
        "Зерно случайности.",
        label=("Seed", "Зерно"))
    eval_every: int = _f(250,
        "Steps between evaluations on the held-out set (and text samples).",
        "Шагов между оценками на отложенной выборке (и примерами текста).",
        label=("Val every", "Оценка val каждые"))
    eval_batches: int = _f(20,
        "Batches per val evaluation.",
        "Батчей на одну оценку val.",
        label=("Val batches", "Батчей на оценку val"))
    log_every: int = _f(1,
        "Steps between lines of metrics.jsonl.",
        "Шагов между строками metrics.jsonl.",
        label=("Log every", "Строка лога каждые"))
    checkpoint_every_min: float = _f(20,
        "Minutes between periodic checkpoints.",
        "Минут между чекпоинтами.",
        label=("Checkpoint every, min", "Чекпоинт каждые, мин"))
    parallel: str = _f("auto",
        "Several cards: auto (DDP under torchrun), ddp, dp (DataParallel), none.",
        "Несколько карт: auto, ddp, dp (DataParallel), none.",
        label=("Several cards", "Несколько карт"), choices=PARALLEL_MODES)
    precision: str = _f("auto",
        "auto: bf16 from compute capability 8.0 on, fp16 with GradScaler below it; on a CPU, bf16 where the "
        "processor multiplies bf16 itself (AVX512-BF16, AMX), else fp32.",
        "auto: bf16 на картах от 8.0, fp16 с GradScaler ниже; на CPU — bf16, если процессор сам умножает "
        "bf16 (AVX512-BF16, AMX), иначе fp32.",
        label=("Precision", "Точность"), choices=PRECISIONS)
    torch_compile: str = _f("auto",
        "torch.compile the model: auto (on a GPU; on CPU when a C++ compiler is found and the run is long "
        "enough to repay the compile time), on, off. If compiling fails, training goes on uncompiled.",
        "torch.compile для модели: auto (на GPU; на CPU — если есть компилятор C++ и прогон достаточно "
        "длинный, чтобы окупить компиляцию), on, off. Если компиляция не удалась, обучение идёт без неё.",
        label=("Compile", "Компиляция"), choices=COMPILE_MODES)
    data_dir: str = _f("",
        "Prepared data folder (shards, tokenizer, manifest); empty: found from constellations.",
        "Папка подготовленных данных; пусто — найти по созвездиям.",
        label=("Data folder", "Папка данных"))

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


def _meta(name: str) -> Any:
    for f in dataclasses.fields(RunConfig):
        if f.name == name:
            return f.metadata
    raise KeyError(f"RunConfig has no field {name!r}")


def field_help(name: str, lang: str = "en") -> str:
    return _meta(name)["ru" if lang == "ru" else "en"]


def field_label(name: str, lang: str = "en") -> str:
    return _meta(name)["label_ru" if lang == "ru" else "label_en"]


def field_choices(name: str) -> tuple[str, ...] | None:
    """The values a field allows, when it is one of a few names (schedule, gpu, ...)."""
    return _meta(name).get("choices")


def field_kind(name: str) -> str:
    """The field's declared type as a word: "int", "float", "str" or "list"."""
    kind = next(f.type for f in dataclasses.fields(RunConfig) if f.name == name)
    return kind if isinstance(kind, str) else kind.__name__


def flag_specs(exclude: Iterable[str] = ()) -> list[tuple[tuple[str, ...], dict]]:
    """One command-line flag per field, as `(option strings, add_argument keywords)`, so every
    command (`lab train`, `lab run`, `lab size`) takes the same flags with the same help:
    `for opts, kw in flag_specs(): parser.add_argument(*opts, **kw)`. Values arrive as text
    (a list field's flag repeats) and `coerce` types them, so a bad value is a ConfigError
    in both languages rather than argparse's own message."""
    out = []
    for f in dataclasses.fields(RunConfig):
        if f.name in exclude:
            continue
        meta, choices = f.metadata, f.metadata.get("choices")
        kw: dict = {"dest": f.name, "default": None, "metavar": meta.get("metavar", f.name.upper()),
                    "help": meta["en"] + (f" ({', '.join(choices)})" if choices else "")}
        if field_kind(f.name) == "list":
            kw["action"] = "append"
        out.append((meta.get("flags", ("--" + f.name.replace("_", "-"),)), kw))
    return out


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
    severity: str = "error"  # or "warning"

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
    elif cfg.limit_min > KAGGLE_LIMIT_MAX_MIN and cfg.machine != "local":
        out.append(Problem("limit_min", f"limit_min {cfg.limit_min:g} leaves no room before Kaggle's 12-hour session "
                                        f"({KAGGLE_SESSION_MIN} min): its timeout must stay below that, with at least "
                                        f"{KAGGLE_MARGIN_FLOOR_MIN:g} min for the start and the final save; use at most "
                                        f"{KAGGLE_LIMIT_MAX_MIN:g} (the lab uses 630)",
                           f"лимит {cfg.limit_min:g} мин не оставляет запаса до 12-часовой сессии Kaggle "
                           f"({KAGGLE_SESSION_MIN} мин): её тайм-аут должен быть меньше, и ещё нужно не меньше "
                           f"{KAGGLE_MARGIN_FLOOR_MIN:g} мин на запуск и последнее сохранение; не больше "
                           f"{KAGGLE_LIMIT_MAX_MIN:g} (лаба берёт 630)"))
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
    for name in field_names():
        allowed = field_choices(name)
        if allowed and getattr(cfg, name) not in allowed:
            out.append(Problem(name, f"{name} must be one of {', '.join(allowed)} (got {getattr(cfg, name)!r})",
                               f"{name}: допустимо {', '.join(allowed)} (сейчас {getattr(cfg, name)!r})"))
    if cfg.decay_start < 0:
        out.append(Problem("decay_start", f"decay_start must be 0 or a step (got {cfg.decay_start})",
                           f"decay_start должен быть 0 или номером шага (сейчас {cfg.decay_start})"))
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


def resumed_config(checkpoint_config: dict, given: dict) -> RunConfig:
    """The config a resumed run continues with: the run as it was (the checkpoint's config), with
    the fields `given` now (name -> value: flags, a config file, the form) on top. Session fields
    come only from `given`. Model fields stay locked: one given with another value than the
    checkpoint's is an error. (That steps_until is above the checkpoint's step is `check_resume`'s.)"""
    names = set(field_names())
    carried = {k: v for k, v in checkpoint_config.items() if k in names and k not in SESSION_FIELDS}
    cfg = RunConfig.from_dict({**carried, **given})
    locked = [p for p in check_resume(cfg, checkpoint_config, -1, set(given)) if p.field in MODEL_FIELDS]
    raise_on_errors(locked)
    return cfg


def fields_off_defaults(cfg: RunConfig) -> set[str]:
    """The fields of `cfg` that differ from the defaults: what a notebook's parameters cell says
    was given, when nothing else does."""
    defaults = RunConfig()
    return {name for name in field_names() if getattr(cfg, name) != getattr(defaults, name)}


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


def card_set(name: str, cards: int = 1) -> str:
    """The lab's name for a card set, as the `gpu` field and the calculator name them: "2xT4",
    "T4", "rtx3050", "cpu"; another card keeps its own name ("2xNVIDIA H100" for two)."""
    name = name.strip()
    short = "cpu" if name.lower() == "cpu" else "T4" if "T4" in name else "rtx3050" if "3050" in name else name
    return f"{cards}x{short}" if cards > 1 and short != "cpu" else short


def divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]
