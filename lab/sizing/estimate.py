"""The estimate: every figure for a run's fields (weights, data, steps, time, quota,
memory), computed from the cards, the measured speeds and the memory formula."""
from __future__ import annotations

from lab.config import Problem, RunConfig
from lab.home import machines_dir
from lab.kaggle.accounts import list_accounts
from lab.sizing.cards import AUTO_GPU, TOKENS_PER_WEIGHT, Card, card_for, weight_count
from lab.sizing.checks import problems
from lab.sizing.figures import Estimate, Figure, unknown
from lab.sizing.inputs import find_manifest, resolve_vocab, tokens_available
from lab.sizing.memory import GB, max_batch, memory_bytes, usable_bytes
from lab.sizing.runtime import RunTime, compiles, kaggle_session_costs, local_session_costs, run_time
from lab.sizing.speedmodel import speed_figure, speed_model
from lab.sizing.speeds import Measured, measured_runs
from lab.sizing.words import format_count, format_number, format_seconds


def _sizes_ok(cfg: RunConfig, vocab: int) -> bool:
    return min(cfg.context, cfg.width, cfg.heads, cfg.layers, cfg.batch_per_card, cfg.grad_accum, vocab) >= 1


def estimate(cfg: RunConfig, vocab: int | None = None, manifest: dict | None = None,
             checkpoint: dict | None = None, runs: list[Measured] | None = None,
             machine_cards: str | None = None) -> Estimate:
    """Every figure for the run, and every problem with its fields. Never raises on bad
    fields (the form calls it with half-typed values): figures it cannot compute are
    "unknown" and the errors say why.

`cfg` is the run as it will train: a continued run's as `lab.settle.preview` settled it (its
    model fields the checkpoint's); nothing here merges it with the checkpoint again.
    manifest: the prepared data's manifest; None looks it up (`data_dir` or the
    constellations). checkpoint: {"step", "config"} of the checkpoint it starts from (its step
    and vocabulary). runs: measured runs; None scans `$LAB_HOME/runs`. machine_cards: with gpu "auto", the card set of the machine the run
    goes to (this computer's, a box's: `card_for` names); None: Kaggle's."""
    if manifest is None:
        manifest = find_manifest(cfg)
    vocab_n, vocab_source = resolve_vocab(vocab, manifest, checkpoint)
    run_cfg = cfg
    gpu_auto = cfg.gpu == "auto"
    card = card_for((machine_cards or AUTO_GPU) if gpu_auto else cfg.gpu)
    precision = (cfg.precision if cfg.precision not in ("auto", "") else card.precision) if card else "fp16"
    if runs is None:
        runs = measured_runs(card.name) if card else []

    est = Estimate(card.name if card else cfg.gpu, gpu_auto, card.cards if card else 1, precision, vocab_n,
                   vocab_source, **{name: unknown("fix the fields first", "сначала исправьте поля")
                                    for name in Estimate.FIGURES}, config=run_cfg)
    if _sizes_ok(run_cfg, vocab_n):
        _size_figures(est, run_cfg, manifest)
        if card is not None:
            steps = max(0, run_cfg.steps_until - (checkpoint["step"] if checkpoint else 0))
            _step_figures(est, run_cfg, card, steps)
            _time_figures(est, run_cfg, card, runs, steps)
            _memory_figures(est, run_cfg, card)
    est.problems = problems(run_cfg, est, card, vocab, manifest)
    est.manifest = manifest
    return est


def _size_figures(est: Estimate, cfg: RunConfig, manifest: dict | None) -> None:
    """Weights, and the data they want against the data there is."""
    n_weights = weight_count(cfg.layers, cfg.width, est.vocab, cfg.context)
    est.weights = Figure(n_weights, "exact", "weights", "12·layers·d² + vocab·d + n·d",
                         "12·слои·d² + словарь·d + n·d")
    wanted = TOKENS_PER_WEIGHT * n_weights
    est.tokens_wanted = Figure(wanted, "estimate", "tokens", f"about {TOKENS_PER_WEIGHT} tokens per weight",
                               f"около {TOKENS_PER_WEIGHT} токенов на вес")
    available = tokens_available(cfg, manifest)
    if not available:
        est.tokens_available = unknown("not prepared yet: the run prepares the data when it starts",
                                        "ещё не подготовлено: прогон подготовит данные при запуске", "tokens")
        est.epochs = unknown("data size unknown", "объём данных неизвестен", "epochs")
        return
    est.tokens_available = Figure(available, "exact", "tokens", "train tokens in the manifest",
                                  "токенов обучения в манифесте")


def _step_figures(est: Estimate, cfg: RunConfig, card: Card, steps: int) -> None:
    """Tokens per optimizer step, and to steps_until."""
    per_step = cfg.batch_per_card * card.cards * cfg.context * cfg.grad_accum
    accum = f" × grad_accum {cfg.grad_accum}" if cfg.grad_accum != 1 else ""
    est.tokens_per_step = Figure(per_step, "exact", "tokens",
                                 f"batch {cfg.batch_per_card} × {card.cards} card(s) × n {cfg.context}{accum}",
                                 f"батч {cfg.batch_per_card} × карт {card.cards} × n {cfg.context}{accum}")
    planned = steps * per_step
    available = est.tokens_available.value
    extra = {"epochs": round(planned / available, 2)} if available else {}
    est.tokens_planned = Figure(planned, "exact", "tokens", f"{steps} steps × {per_step} tokens",
                                f"{steps} шагов × {per_step} токенов", extra)
    if available:  # the run's own passes over its data: what it reads, not what its size would want
        est.epochs = Figure(round(planned / available, 2), "exact", "epochs",
                            f"passes over the data the run makes: {format_count(planned)} tokens to steps_until "
                            f"/ {format_count(available)} in the data",
                            f"сколько раз прогон прочтёт данные: {format_count(planned, 'ru')} токенов до «Шагов до» "
                            f"/ {format_count(available, 'ru')} в данных")


def _time_figures(est: Estimate, cfg: RunConfig, card: Card, runs: list[Measured], steps: int) -> None:
    """Speed, the whole run's time and the Kaggle quota it spends: one number for both, the
    one Auto compares with each account's quota."""
    compiled = compiles(cfg, card, est.vocab, steps)
    model = speed_model(card, est.precision, runs, compiled)
    est.tok_s = speed = speed_figure(model, cfg, est.vocab)
    kaggle = on_kaggle(cfg.machine)
    costs = kaggle_session_costs(None if cfg.machine == "auto" else cfg.machine) if kaggle else local_session_costs()
    t = run_time(model, cfg, est.vocab, steps, costs, compiled, speed.value)
    lo, hi = _hours_interval(t, speed)
    parts = {"steps": t.train_s, "evaluations": t.evals_s, "saves": t.saves_s, "compiling": t.compile_s,
             "session_starts": t.sessions_s}
    extra = {"sessions": t.sessions, "session_hours": round(t.longest_session_s / 3600, 3),
             "steps_per_session": t.steps_per_session, "interval": [round(lo, 3), round(hi, 3)],
             "parts": {k: round(v / 3600, 3) for k, v in parts.items()}}
    # In seconds, not a share: 10 min of session starts beside 4.5 s of steps is no "+99%".
    rest = t.total_s - t.train_s
    est.run_hours = Figure(round(t.total_s / 3600, 3), speed.kind, "hours",
                           f"{steps:,} steps at {speed.value:,} tokens/s: {format_seconds(t.train_s)} of training, "
                           f"and {format_seconds(rest)} for evaluations, samples, saves, compiling and session starts "
                           f"({costs.note})",
                           f"{format_number(steps, 'ru')} шагов при {format_number(speed.value, 'ru')} токенов/с: "
                           f"{format_seconds(t.train_s, 'ru')} обучения и {format_seconds(rest, 'ru')} на оценки, "
                           f"примеры текста, сохранения, компиляцию и запуски сессий ({costs.note_ru})", extra)
    if not kaggle:
        est.quota_hours = Figure(0.0, "exact", "hours", "this computer spends no Kaggle quota",
                                 "этот компьютер не тратит квоту Kaggle")
        return
    est.quota_hours = Figure(est.run_hours.value, speed.kind, "hours",
                             "the whole run's time on Kaggle, session starts included; 2×T4 costs the same "
                             "per hour as one GPU",
                             "время всего прогона на Kaggle вместе с запусками сессий; час 2×T4 стоит как час "
                             "одной GPU", dict(extra))


def on_kaggle(machine: str) -> bool:
    """Whether the run spends Kaggle quota: on a named account (not this computer, not one of
    the lab's boxes), or on Auto's pick, which is a Kaggle account whenever the lab has one
    (lab.machines.auto.choose)."""
    if machine == "local" or (machine != "auto" and (machines_dir() / machine).is_dir()):  # a box of the lab's
        return False
    if machine != "auto":
        return True
    return bool(list_accounts())


def _hours_interval(t: RunTime, speed: Figure) -> tuple[float, float]:
    """The run's hours at the ends of the speed's interval (steps, evaluations and samples
    scale with the step time; the rest does not)."""
    lo_tok, hi_tok = speed.extra.get("interval") or (speed.value, speed.value)
    timed = t.train_s + t.evals_s
    rest = t.total_s - timed
    return ((rest + timed * speed.value / max(hi_tok, 1)) / 3600, (rest + timed * speed.value / max(lo_tok, 1)) / 3600)


def _memory_figures(est: Estimate, cfg: RunConfig, card: Card) -> None:
    """Memory per card at this batch, and the largest batch that fits."""
    precision, vocab = est.precision, est.vocab
    mem = memory_bytes(cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, cfg.batch_per_card,
                       precision, card.cards, card.context_gb)
    usable = usable_bytes(card)
    usable_gb = None if usable is None else round(usable / GB, 1)
    est.memory_per_card_gb = Figure(round(mem.total / GB, 2), "estimate", "GB",
                                    "weights+grads+AdamW 16·N, 16-bit copies, saved activations (SDPA), "
                                    "logits, 10% slack, CUDA context (formula in lab.sizing.memory_bytes)",
                                    "веса+градиенты+AdamW 16·N, 16-битные копии, активации (SDPA), логиты, "
                                    "10% запаса, контекст CUDA (формула в lab.sizing.memory_bytes)",
                                    {"usable_gb": usable_gb, "parts": mem.parts_gb()})
    if usable is None:
        est.max_batch_per_card = unknown("this computer's memory is unknown", "объём памяти неизвестен")
        return
    best = max_batch(cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, usable, precision, card.cards,
                     card.context_gb)
    est.max_batch_per_card = Figure(best, "estimate", "sequences",
                                    f"largest batch per card within {usable_gb:g} GB",
                                    f"наибольший батч на карту в пределах {usable_gb:g} ГБ")


def validate(cfg: RunConfig, manifest: dict | None = None, checkpoint: dict | None = None,
             vocab: int | None = None) -> list[Problem]:
    """Everything wrong with a run's fields, in English and Russian: the field checks of
    `lab.config.check`, the context against the data, and whether the batch fits the card
    (where a continued run starts is `lab.settle.preview`'s). Errors refuse the launch;
    warnings are shown before it."""
    return estimate(cfg, vocab=vocab, manifest=manifest, checkpoint=checkpoint).problems


