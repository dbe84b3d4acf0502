"""The recipe lab's figures from points and a fit (no runs needed)."""
from __future__ import annotations

from lab.recipes.fit import Fit, law
from lab.recipes.plots import loss_vs_lr, write_plots
from lab.recipes.points import Point

LAW = dict(E=2.0, A=50.0, B=80.0, alpha=0.4, beta=0.35)


def test_the_plots_are_written_and_loss_against_lr_needs_several_rates(tmp_path):
    points = [Point(int(n), int(d), law(n, d, **LAW), lr=1e-3, layers=2, width=64)
              for n in (1e5, 1e6, 1e7) for d in (1e6, 1e7, 1e8)]
    assert loss_vs_lr(points) is None  # one rate per size: nothing to compare
    points += [Point(int(1e6), int(1e8), law(1e6, 1e8, **LAW) + bump, lr=lr, layers=2, width=64)
               for lr, bump in ((3e-4, 0.05), (3e-3, 0.02), (1e-2, 0.3))]
    fit = Fit(**LAW, points=len(points), sizes=3)
    written = {p.name for p in write_plots(tmp_path, points, fit)}
    assert written == {"loss-vs-tokens.png", "loss-vs-lr.png", "isoloss.png", "residuals.png"}
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in written)
