"""`lab size`: the sizing calculator as a table or JSON, over `lab.sizing`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.api import sizing
from lab.api.runs import preview
from lab.config import UserError
from lab.flags import add_config_flags, fields_from_args

LABELS = {  # figure -> (English, Russian)
    "weights": ("weights", "веса"),
    "tokens_per_step": ("tokens per step", "токенов за шаг"),
    "tokens_wanted": ("tokens wanted", "токенов нужно"),
    "tokens_available": ("tokens available", "токенов есть"),
    "epochs": ("epochs", "эпох"),
    "tokens_planned": ("tokens to steps_until", "токенов до «Шагов до»"),
    "tok_s": ("speed", "скорость"),
    "run_hours": ("time, whole run", "время всего прогона"),
    "memory_per_card_gb": ("memory per card", "память на карту"),
    "max_batch_per_card": ("largest batch per card", "наибольший батч"),
    "quota_hours": ("Kaggle quota, whole run", "квота Kaggle на весь прогон"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="a run's config.json to start from")
    add_config_flags(parser, exclude=())  # the run's fields, as `lab train` and `lab run` take them
    parser.add_argument("--vocab", type=int, default=None,
                        help=f"tokenizer vocabulary (default: the prepared data's, else {sizing.DEFAULT_VOCAB})")
    parser.add_argument("--manifest", metavar="FILE", help="a prepared data manifest.json (default: found)")
    parser.add_argument("--grow", metavar="RUN",
                        help="also say whether to grow, from this run's val history (a run id or folder)")
    parser.add_argument("--calibration", action="store_true",
                        help="print one line: how far the calculator's speed predictions were from what the lab's "
                             "runs then measured")
    parser.add_argument("--measure-parts", action="store_true",
                        help="measure this computer's parts again (the short microbenchmark that shapes the speed "
                             "model; done on its own the first time a run here is sized, unless LAB_MEASURE_PARTS=0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--lang", choices=("en", "ru"), default="en", help="language of the messages")


def run(args: argparse.Namespace) -> int:
    if args.calibration:
        print(sizing.calibration())
        return 0
    given = fields_from_args(args, exclude=())  # a config file's fields count as given: locked when resuming
    manifest = _read_json(args.manifest) if args.manifest else None
    est = preview(given, vocab=args.vocab, manifest=manifest).estimate  # the run `lab run` would register
    if _measured_parts(est, args.measure_parts, args.lang):
        est = preview(given, vocab=args.vocab, manifest=manifest).estimate
    verdict = sizing.grow(args.grow, manifest, args.vocab) if args.grow else None
    if est.errors and not args.json:  # a field is wrong: its line, not a table of unknowns
        for p in est.errors:
            print(f"lab size: error: {p.message(args.lang)}", file=sys.stderr)
        return 2
    if args.json:
        out = est.to_dict()
        if verdict is not None:
            out["when_to_grow"] = verdict.to_dict()
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        print(render(est, args.lang, errors=False))  # errors go to stderr below
        if verdict is not None:
            print(("\nWhen to grow: " if args.lang == "en" else "\nКогда расти: ") + verdict.reason(args.lang))
    for p in est.errors:
        print(f"lab size: error: {p.message(args.lang)}", file=sys.stderr)
    return 2 if est.errors else 0


def _read_json(path: str | Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} does not hold a JSON object")
    return data


def _measured_parts(est: sizing.Estimate, again: bool, lang: str) -> bool:
    """Measures this computer's parts when the estimate is for it and they are not measured yet (or
    when asked again), saying so on stderr; whether it did."""
    wanted = sizing.parts_wanted(est)
    if again and est.gpu == "cpu":
        wanted = (est.precision, wanted[1] if wanted else None)
    if wanted is None or not (again or sizing.auto_measure()):
        return False
    load = sizing.busy()
    if load and not again:
        print("lab size: " + (f"этот компьютер занят (нагрузка {load:.1f} на ядро): его части измерятся, когда он "
                              f"освободится; до тех пор форма скорости — априорная лабы (`lab size --measure-parts` "
                              f"измерит сейчас)".replace(".", ",", 1) if lang == "ru" else
                              f"this computer is busy (load {load:.1f} per core): its parts are measured when it is "
                              f"quiet; until then the speed's shape is the lab's prior (`lab size --measure-parts` "
                              f"measures now)"), file=sys.stderr)
        return False
    precision, threads = wanted
    print("lab size: " + ("измеряю части этого компьютера (один раз, около 10 с)…" if lang == "ru" else
                          "measuring this computer's parts once (about 10 s)…"), file=sys.stderr, flush=True)
    try:
        sizing.measure_parts(precision, threads)
    except UserError as e:
        print(f"lab size: {e}", file=sys.stderr)
        return False
    return True


def render(est: sizing.Estimate, lang: str = "en", errors: bool = True) -> str:
    """The figures as an aligned table, each with where it comes from, then the problems."""
    ru = lang == "ru"
    head = (f"{est.gpu}{' (auto)' if est.gpu_auto else ''}, {est.precision}, vocab {est.vocab}"
            f" ({est.vocab_source})")
    rows = []
    for name in sizing.Estimate.FIGURES:
        fig = getattr(est, name)
        kind = sizing.KIND_RU[fig.kind] if ru else fig.kind
        rows.append((LABELS[name][1 if ru else 0], _value_text(name, fig, lang), kind))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [head, ""] + [f"  {a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    if est.predicted_val_loss is not None:  # the recipe lab's fit for this data
        label = "Ожидаемый val loss" if ru else "Predicted val loss"
        lines.append(f"  {label:<{w0}}  {sizing.predicted_text(est.predicted_val_loss, lang):<{w1}}  "
                     f"{sizing.KIND_RU['fitted'] if ru else 'fitted'}")
    if est.tok_s.value is not None:  # which shape the speed has: the machine's own parts, or a prior
        lines.append(("скорость: " if ru else "speed: ") + (est.tok_s.note_ru if ru else est.tok_s.note))
    for p in est.problems if errors else est.warnings:
        mark = ("ошибка" if ru else "error") if p.severity == "error" else ("внимание" if ru else "warning")
        lines.append(f"{mark}: {p.message(lang)}")
    return "\n".join(lines)


def _value_text(name: str, fig: sizing.Figure, lang: str) -> str:
    v = fig.value
    if v is None:
        return "?" if fig.kind == "unknown" else "-"
    num = sizing.format_number
    if name == "weights":
        return f"{num(v, lang)} ({sizing.format_count(v, lang)})"
    if name in ("tokens_wanted", "tokens_available", "tokens_planned"):
        return ("≈ " if fig.kind == "estimate" else "") + sizing.format_count(v, lang)
    if name == "tokens_per_step":
        return num(v, lang)
    if name == "epochs":
        return num(v, lang)
    if name == "tok_s":
        return f"{num(v, lang)} " + ("ток/с" if lang == "ru" else "tokens/s") + _interval(fig, lang, num)
    if name in ("run_hours", "quota_hours"):
        return sizing.format_hours(v, lang) + _interval(fig, lang, sizing.format_hours) + _sessions(fig, lang)
    if name == "memory_per_card_gb":
        usable = fig.extra.get("usable_gb")
        unit = "ГБ" if lang == "ru" else "GB"
        return f"{num(v, lang)} {unit}" + (f" / {num(usable, lang)} {unit}" if usable else "")
    return num(v, lang)


def _interval(fig: sizing.Figure, lang: str, fmt) -> str:
    lo_hi = fig.extra.get("interval")
    if not lo_hi or fig.kind == "exact":
        return ""
    return f" ({fmt(lo_hi[0], lang)}–{fmt(lo_hi[1], lang)})"


def _sessions(fig: sizing.Figure, lang: str) -> str:
    n = fig.extra.get("sessions") or 0
    if n < 2:
        return ""
    each = sizing.format_hours(fig.extra["session_hours"], lang)
    return f", сессий {n} до {each}" if lang == "ru" else f", {n} sessions of up to {each}"
