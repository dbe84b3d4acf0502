"""The law in bits per byte: points of two tokenizers on one held-out text fit together on the
tokenizer-free scale (L in bits per byte, D in bytes), and only there."""
from __future__ import annotations

import json
import math
import random

import pytest

from lab.config import UserError
from lab.recipes.fit import fit_law, law
from lab.recipes.points import Point, in_bits_per_byte, write_points_file
from tests.conftest import lab
from tests.recipes.test_fit import TRUE

# Two tokenizers cutting one text: a small vocabulary's tokens hold fewer bytes.
BYTES_PER_TOKEN = {"small-vocab": 2.5, "large-vocab": 4.0}


def two_tokenizer_points(seed: int = 1) -> list[Point]:
    """Runs whose bits per byte follow one law in (N, bytes), logged as their own tokenizers see it."""
    rng = random.Random(seed)
    out = []
    for tok, per_token in BYTES_PER_TOKEN.items():
        for n in (1e4, 1e5, 1e6, 1e7):
            for d_bytes in (3e5, 3e6, 3e7, 3e8):
                bpb = law(n, d_bytes, **TRUE) * math.exp(rng.gauss(0, 0.003))
                out.append(Point(int(n), int(d_bytes / per_token), val_loss=bpb * math.log(2) * per_token,
                                 val_set=f"val-{tok}", tokenizer=tok, val_bpb=bpb, val_text="one-text",
                                 train_bytes=int(d_bytes)))
    return out


def test_two_tokenizers_are_refused_in_nats_and_fit_together_in_bits_per_byte():
    points = two_tokenizer_points()
    with pytest.raises(UserError, match="lab fit --bpb"):
        fit_law(points)
    scaled = in_bits_per_byte(points)
    assert len(scaled) == 32 and {(p.val_set, p.tokenizer) for p in scaled} == {("one-text", None)}
    fit = fit_law(scaled, metric="bpb")
    assert fit.metric == "bpb" and fit.points == 32 and fit.val_set == "one-text"
    assert fit.E == pytest.approx(TRUE["E"], abs=0.03)
    assert fit.alpha == pytest.approx(TRUE["alpha"], abs=0.03)
    assert fit.beta == pytest.approx(TRUE["beta"], abs=0.03)


def test_points_without_bits_per_byte_are_left_out_of_that_scale():
    points = two_tokenizer_points()[:3] + [Point(1000, 1000, 3.0)]
    assert [p.weights for p in in_bits_per_byte(points)] == [p.weights for p in points[:3]]


def test_lab_fit_bpb_fits_a_points_file_of_two_tokenizers(tmp_path):
    path = tmp_path / "points.jsonl"
    write_points_file(path, two_tokenizer_points())
    out = json.loads(lab("fit", "--points", str(path), "--bpb", "--json",
                         "--plots", str(tmp_path / "plots")).stdout)
    assert out["metric"] == "bpb" and out["points"] == 32
    assert out["alpha"] == pytest.approx(TRUE["alpha"], abs=0.03)
    assert sorted(p.rsplit("/", 1)[1] for p in out["plots"]) == ["bpb-residuals.png", "bpb-vs-bytes.png"]
    text = lab("fit", "--points", str(path), "--bpb").stdout
    assert "in bits per byte, D in bytes of text" in text
    in_nats = lab("fit", "--points", str(path))  # one tokenizer's points only
    assert "other val set(s) or tokenizer(s) are fitted apart" in in_nats.stderr
