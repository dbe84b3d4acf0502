"""How sure the fit says it is, checked against laws we make up: each law's parameters and its
predictions 3× and 20× past the largest size fitted must lie in the fit's 95% intervals for at
least 9 laws of 10 (issue 41: a bootstrap over the points missed E and β, and said nothing of a
prediction past the data, which came out 0.07 and 0.14 nats low)."""
from __future__ import annotations

import math
import random

import pytest

from lab.recipes.fit import fit_law, law
from lab.recipes.points import Point

PARAMS = ("E", "A", "B", "alpha", "beta")


def made_up_law(seed: int) -> tuple[dict, list[Point]]:
    """A law of the lab's kind (4 model sizes × 5 amounts of data, as a first sweep gives; Chinchilla's
    law moved a little) with its own noise between 0.2% and 0.8%, the sizes small enough that the
    floor E lies well below every point: where a bootstrap over the points missed β and B in 2 laws
    of 10 and came out 0.06 nats high 20× past the data (measured while writing this test)."""
    rng = random.Random(seed)
    while True:
        truth = dict(E=rng.uniform(1.5, 2.0), A=rng.uniform(300, 500), B=rng.uniform(300, 500),
                     alpha=rng.uniform(0.3, 0.38), beta=rng.uniform(0.25, 0.32))
        smallest = math.exp(rng.uniform(math.log(1e5), math.log(1e6)))
        sizes = [smallest * 2.5 ** i for i in range(4)]
        tokens = [20 * smallest * 2.5 ** k for k in range(5)]
        spans = [law(sizes[0], tokens[0], **truth) / law(sizes[-1], tokens[0], **truth),
                 law(sizes[0], tokens[0], **truth) / law(sizes[0], tokens[-1], **truth)]
        if min(spans) > 1.05:  # a term the data cannot see is no law to check intervals on
            break
    noise = rng.choice((0.002, 0.004, 0.008))
    points = [Point(int(n), int(d), law(int(n), int(d), **truth) * math.exp(rng.gauss(0, noise)))
              for n in sizes for d in tokens]
    return truth, points


@pytest.fixture(scope="module")
def fitted() -> list[tuple[dict, object]]:
    out = []
    for seed in range(10):
        truth, points = made_up_law(seed)
        out.append((truth, fit_law(points)))
    return out


def test_parameter_intervals_cover_made_up_laws_in_nine_of_ten(fitted):
    for name in PARAMS:
        covered = [fit.intervals[name][0] <= truth[name] <= fit.intervals[name][1] for truth, fit in fitted]
        assert sum(covered) >= 9, f"{name}: {sum(covered)} of 10"


@pytest.mark.parametrize("factor", [3, 20])
def test_predictions_past_the_largest_size_cover_the_law_in_nine_of_ten(fitted, factor):
    covered, widths = [], []
    for truth, fit in fitted:
        weights = factor * fit.largest
        tokens = 20 * weights  # the tokens that size wants
        low, high = fit.predict_interval(weights, tokens)
        covered.append(low <= law(weights, tokens, **truth) <= high)
        widths.append((high - low) / fit.predict(weights, tokens))
    assert sum(covered) >= 9, f"{factor}×: {sum(covered)} of 10"
    assert max(widths) < 0.5  # covering, not by saying nothing


def test_a_prediction_widens_as_it_leaves_the_data(fitted):
    for _, fit in fitted:
        widths = []
        for factor in (1, 3, 20):
            low, high = fit.predict_interval(factor * fit.largest, 20 * factor * fit.largest)
            widths.append(high - low)
        assert widths[0] < widths[1] < widths[2]
