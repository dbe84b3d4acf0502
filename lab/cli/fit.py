"""`lab fit`: L(N, D) = E + A/N^α + B/D^β fitted to the lab's points (or a file's)."""
from __future__ import annotations

import argparse
import json
import sys

from lab.api import recipes


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--points", metavar="FILE",
                        help='JSON lines {"weights": N, "tokens": D, "val_loss": L}; default: the lab\'s own points')
    parser.add_argument("--val-set", default=None, metavar="ID",
                        help="fit the points of this val set (an id prefix; with --bpb, of this val text); "
                             "default: the one with the most points")
    parser.add_argument("--bpb", action="store_true",
                        help="fit in bits per byte against bytes of text, so runs of different tokenizers and "
                             "vocabularies on one held-out text fit together")
    parser.add_argument("--predict", action="append", default=[], metavar="WEIGHTS:TOKENS", type=_weights_tokens,
                        help="also print the law's loss at WEIGHTS and TOKENS (1.5e7:3e8, say) with its 95%% interval, "
                             "which widens as it leaves the fitted points (repeatable)")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="write the PNGs here (default for the lab's points: $LAB_HOME/recipes/plots)")
    parser.add_argument("--list", action="store_true", help="list the points (and the runs that gave none) and stop")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args.points)
    got = recipes.fit(args.points, args.val_set, args.bpb, args.plots)
    fit = got.fit
    predictions = [recipes.predict(fit, n, d) for n, d in args.predict]
    if got.others and not args.json:
        kind = "val text" if args.bpb else "val set"
        print(f"fitting the {got.points} points of {kind} {got.group[0] or '?'}; points of "
              f"{got.others} other {kind}(s){'' if args.bpb else ' or tokenizer(s)'} are fitted apart (--val-set)",
              file=sys.stderr)
    out = {**fit.to_dict(), "fit_file": str(got.saved) if got.saved else None, "plots": got.plots,
           "predictions": [p.to_dict() for p in predictions]}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    scale = " in bits per byte, D in bytes of text," if args.bpb else ""
    print(f"L(N, D) = E + A/N^α + B/D^β{scale} from {fit.points} points ({fit.sizes} sizes), 95 % intervals:")
    for name in ("E", "A", "B", "alpha", "beta"):
        lo, hi = fit.intervals.get(name, (None, None))
        band = f"  [{lo:.4g}, {hi:.4g}]" if lo is not None else "  (the points do not tell it apart)"
        print(f"  {name:<5} = {getattr(fit, name):.4g}{band}")
    if predictions:
        print("predictions, 95 % intervals (where a run would land):")
    for p in predictions:
        print("  " + _prediction_line(p, "bits per byte" if args.bpb else "loss"))
    if got.saved:
        print(f"saved {got.saved}" + ("" if args.bpb else ": the calculator now predicts val loss for this data"))
    for p in got.plots:
        print(f"plot {p}")
    return 0


def _weights_tokens(text: str) -> tuple[float, float]:
    """"1.5e7:3e8" -> (15000000.0, 300000000.0); argparse says the error on one line."""
    weights, sep, tokens = text.partition(":")
    try:
        n, d = float(weights.replace("_", "")), float(tokens.replace("_", ""))
    except ValueError:
        n = d = 0.0
    if not sep or not n > 0 or not d > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give WEIGHTS:TOKENS, both above 0 (1.5e7:3e8, say)")
    return n, d


def _prediction_line(p: recipes.Prediction, unit: str) -> str:
    where = f"; {p.beyond:g}× the largest size fitted" if p.beyond and p.beyond > 1 else ""
    band = f" ({p.interval[0]:.4f}–{p.interval[1]:.4f})" if p.interval else " (no interval: the points do not tell the law apart)"
    return f"N {p.weights:,} weights, D {p.tokens:,}: {unit} {p.loss:.4f}{band}{where}"


def _list(points_file: str | None) -> int:
    for p in recipes.points(points_file):
        print(json.dumps(p.to_dict(), ensure_ascii=False))
    if points_file is None:
        for run_id, why in recipes.unpointed():
            print(f"# {run_id}: no point ({why})", file=sys.stderr)
    return 0
