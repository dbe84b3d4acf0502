"""The fit of L(N, D) = E + A/N^α + B/D^β: recovery of a known law, too few points, `lab fit`."""
from __future__ import annotations

import json
import math
import random

import pytest

from lab.config import UserError
from lab.recipes.fit import Fit, NotEnoughPoints, fit_law, law
from lab.recipes.points import Point, write_points_file
from tests.conftest import lab

TRUE = dict(E=2.0, A=50.0, B=80.0, alpha=0.4, beta=0.35)


def known_law_points(noise: float = 0.003, seed: int = 1, val_set: str | None = None) -> list[Point]:
    rng = random.Random(seed)
    return [Point(int(n), int(d), law(n, d, **TRUE) * math.exp(rng.gauss(0, noise)), val_set=val_set)
            for n in (1e4, 1e5, 1e6, 1e7) for d in (1e5, 1e6, 1e7, 1e8)]


def test_the_fit_recovers_a_known_law_from_noisy_points():
    fit = fit_law(known_law_points())
    assert fit.E == pytest.approx(TRUE["E"], abs=0.03)
    assert fit.alpha == pytest.approx(TRUE["alpha"], abs=0.03)
    assert fit.beta == pytest.approx(TRUE["beta"], abs=0.03)
    assert fit.points == 16 and fit.sizes == 4
    for name in ("E", "A", "B", "alpha", "beta"):
        low, high = fit.intervals[name]
        assert low <= high


def test_the_prediction_band_holds_the_prediction_and_the_optimal_size_balances_the_terms():
    cov = [[0.0] * 5 for _ in range(5)]
    cov[3][3] = 0.01 ** 2  # α alone uncertain: the band widens with log N, away from where α was fitted
    fit = Fit(**TRUE, points=16, sizes=4, cov=cov, noise=0.0, t95=2.0, largest=1e7)
    low, high = fit.predict_interval(1e6, 1e8)
    assert low < fit.predict(1e6, 1e8) < high
    far_low, far_high = fit.predict_interval(2e8, 1e8)
    assert (far_high - far_low) / fit.predict(2e8, 1e8) > 0  # and stays an interval past the data
    n = fit.optimal_weights_for_tokens(1e9)
    # At the compute-optimal split the two terms' marginal gains are equal.
    assert fit.alpha * fit.A / n ** fit.alpha == pytest.approx(fit.beta * fit.B / 1e9 ** fit.beta, rel=1e-9)
    n_opt, d_opt = fit.optimal_split(6 * n * 1e9)
    assert n_opt == pytest.approx(n, rel=1e-6) and d_opt == pytest.approx(1e9, rel=1e-6)


def test_too_few_points_says_so_and_fits_nothing():
    two_sizes = [p for p in known_law_points() if p.weights < 1e6]
    with pytest.raises(NotEnoughPoints, match="at least 3 sizes"):
        fit_law(two_sizes)
    two_d_each = [p for p in known_law_points() if p.tokens < 1e7]
    with pytest.raises(NotEnoughPoints):
        fit_law(two_d_each)


def test_points_of_different_val_sets_are_never_fitted_together():
    mixed = known_law_points(val_set="a") + known_law_points(seed=2, val_set="b")
    with pytest.raises(UserError, match="different val sets"):
        fit_law(mixed)


def test_lab_fit_reads_a_points_file_and_prints_one_json_object(tmp_path, recipe_home):
    path = tmp_path / "points.jsonl"
    write_points_file(path, known_law_points())
    out = json.loads(lab("fit", "--points", str(path), "--json").stdout)
    assert {"E", "A", "B", "alpha", "beta", "points", "intervals"} <= set(out)
    assert out["points"] == 16
    assert out["alpha"] == pytest.approx(TRUE["alpha"], abs=0.03)
    assert set(out["intervals"]) == {"E", "A", "B", "alpha", "beta"}


def test_lab_fit_with_too_few_points_is_one_line_and_exit_2(tmp_path, recipe_home):
    path = tmp_path / "few.jsonl"
    path.write_text('{"weights": 1000, "tokens": 5000, "val_loss": 4.2}\n'
                    '{"weights": 2000, "tokens": 5000, "val_loss": 4.0}\n')
    proc = lab("fit", "--points", str(path), "--json", check=False)
    assert proc.returncode == 2
    assert "too few points" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"weights": "many"}\n')
    proc = lab("fit", "--points", str(bad), check=False)
    assert proc.returncode == 2 and "bad.jsonl:1" in proc.stderr
