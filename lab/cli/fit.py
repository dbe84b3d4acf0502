"""`lab fit`: L(N, D) = E + A/N^α + B/D^β fitted to the lab's points (or a file's)."""
from __future__ import annotations

import argparse
import json
import sys

from lab.config import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--points", metavar="FILE",
                        help='JSON lines {"weights": N, "tokens": D, "val_loss": L}; default: the lab\'s own points')
    parser.add_argument("--val-set", default=None, metavar="ID",
                        help="fit the points of this val set (an id prefix; with --bpb, of this val text); "
                             "default: the one with the most points")
    parser.add_argument("--bpb", action="store_true",
                        help="fit in bits per byte against bytes of text, so runs of different tokenizers and "
                             "vocabularies on one held-out text fit together")
    parser.add_argument("--bootstrap", type=int, default=100, metavar="K", help="bootstrap resamples for the intervals")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="write the PNGs here (default for the lab's points: $LAB_HOME/recipes/plots)")
    parser.add_argument("--list", action="store_true", help="list the points (and the runs that gave none) and stop")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from lab.recipes.fit import fit_law, save_fit
    from lab.recipes.points import groups, in_bits_per_byte, lab_points, read_points_file
    own = not args.points
    points = lab_points() if own else read_points_file(args.points)
    if args.list:
        return _list(points, own)
    if args.bpb:
        points = in_bits_per_byte(points)  # val_set is now the held-out text's id, tokenizer None
    found = groups(points)
    if args.val_set:
        found = {k: v for k, v in found.items() if (k[0] or "").startswith(args.val_set)}
        if not found:
            raise UserError(f"no points on val set {args.val_set!r}; `lab fit --list` shows the points")
    if not found:
        raise UserError("no points yet: finished runs whose rate ended small give points (lab sweep, lab branch)"
                        + ("; in bits per byte, only those whose data is in this lab home" if args.bpb else ""))
    key, chosen = max(found.items(), key=lambda kv: len(kv[1]))
    others = [k for k in found if k != key]
    if others and not args.json:
        kind = "val text" if args.bpb else "val set"
        print(f"fitting the {len(chosen)} points of {kind} {key[0] or '?'}; points of "
              f"{len(others)} other {kind}(s){'' if args.bpb else ' or tokenizer(s)'} are fitted apart (--val-set)",
              file=sys.stderr)
    fit = fit_law(chosen, bootstrap=args.bootstrap, metric="bpb" if args.bpb else "loss")
    saved = save_fit(fit) if own and key != (None, None) else None
    plots = []
    plots_dir = args.plots or (str(_plots_home()) if own else None)
    if plots_dir:
        from lab.recipes.plots import write_plots
        runs = _runs_of(chosen) if own else []
        plots = [str(p) for p in write_plots(plots_dir, chosen, fit, runs)]
    out = {**fit.to_dict(samples=False), "fit_file": str(saved) if saved else None, "plots": plots}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    scale = " in bits per byte, D in bytes of text," if args.bpb else ""
    print(f"L(N, D) = E + A/N^α + B/D^β{scale} from {fit.points} points ({fit.sizes} sizes), 95 % bootstrap intervals:")
    for name in ("E", "A", "B", "alpha", "beta"):
        lo, hi = fit.intervals.get(name, (None, None))
        band = f"  [{lo:.4g}, {hi:.4g}]" if lo is not None else ""
        print(f"  {name:<5} = {getattr(fit, name):.4g}{band}")
    if saved:
        print(f"saved {saved}" + ("" if args.bpb else ": the calculator now predicts val loss for this data"))
    for p in plots:
        print(f"plot {p}")
    return 0


def _plots_home():
    from lab.home import lab_home
    return lab_home() / "recipes" / "plots"


def _runs_of(points) -> list:
    """The registry runs behind the points, with the parents of branches (for the plots)."""
    from lab.runs import list_runs
    ids = {p.run for p in points} | {p.branch_of for p in points}
    return [r for r in list_runs() if r.id in ids or (r.parent or {}).get("run") in ids]


def _list(points, own: bool) -> int:
    for p in points:
        print(json.dumps(p.to_dict(), ensure_ascii=False))
    if own:
        from lab.recipes.points import run_point
        from lab.runs import list_runs
        for r in list_runs():
            point, why = run_point(r)
            if point is None:
                print(f"# {r.id}: no point ({why})", file=sys.stderr)
    return 0
