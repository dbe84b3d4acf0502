"""Val bits per byte: from a run's val loss and its val split's tokens and bytes, in `lab runs`;
"-" where this lab home does not hold the run's data."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from lab.config import RunConfig
from lab.kernel.metrics import read_metrics
from lab.models.bpb import bits_per_byte, last_val, val_bpb
from lab.runs import Settled, create_run
from tests.conftest import lab_here


def test_val_bpb_is_the_val_loss_over_the_val_splits_bytes_per_token(trained):
    row = last_val(read_metrics(trained.run.folder))
    m = json.loads((trained.data / "manifest.json").read_text())
    want = row["val_loss"] * m["val_tokens"] / m["val_bytes"] / math.log(2)
    assert val_bpb(row, trained.run.cfg) == bits_per_byte(row["val_loss"] * m["val_tokens"], m["val_bytes"])
    assert val_bpb(row, trained.run.cfg) == pytest.approx(want, rel=1e-12)
    assert 1.0 < want < row["val_loss"] / math.log(2)  # more than a byte a token: fewer bits a byte than a token


def test_the_val_set_a_row_names_finds_its_data_without_the_runs_data_dir(trained):
    row = last_val(read_metrics(trained.run.folder))
    cfg = replace(trained.run.cfg, data_dir="")
    assert val_bpb(row, cfg) == val_bpb(row, trained.run.cfg)
    assert val_bpb({**row, "val_set": "0000000000000000"}, cfg) is None  # data not in this lab home
    assert val_bpb({"step": 1, "loss": 3.0}, cfg) is None


def test_lab_runs_shows_val_bits_per_byte_beside_val_loss_or_a_dash(trained):
    other = create_run(Settled.whole(RunConfig(context=32, width=32, heads=2, layers=2)))
    (other.folder / "metrics.jsonl").write_text(json.dumps({"step": 10, "tokens": 10, "val_loss": 4.0,
                                                            "val_set": "0000000000000000"}) + "\n")
    code, out, _ = lab_here("runs")
    assert code == 0
    head, *lines = out.splitlines()
    assert head.split()[4:7] == ["val", "val", "bpb"]
    mine = next(line for line in lines if line.startswith(trained.run.id)).split()
    row = last_val(read_metrics(trained.run.folder))
    assert mine[4:6] == [f"{row['val_loss']:.3f}", f"{val_bpb(row, trained.run.cfg):.3f}"]
    theirs = next(line for line in lines if line.startswith(other.id)).split()
    assert theirs[4:6] == ["4.000", "-"]


def test_a_runs_point_carries_its_bits_per_byte_its_val_text_and_the_bytes_it_trained_on(trained):
    from lab import corpus
    from lab.corpus.manifests import read_manifest, val_text_id
    from lab.corpus.valtext import val_documents
    from lab.recipes.points import run_point
    point, why = run_point(trained.run)
    assert why == "point"
    row = last_val(read_metrics(trained.run.folder))
    m = read_manifest(trained.data)
    assert point.val_bpb == val_bpb(row, trained.run.cfg)
    per_token = (m["constellations"]["pydoc"]["bytes"] - m["val_bytes"]) / m["train_tokens"]
    assert point.train_bytes == round(row["tokens"] * per_token)
    # Another tokenizer on the same text: another val set, the same held-out text.
    other = corpus.prepare(["pydoc"], vocab=700, progress=False)
    o = read_manifest(other)
    assert o["val_set"] != m["val_set"] and o["tokenizer"]["sha256"] != m["tokenizer"]["sha256"]
    assert val_text_id(o) == val_text_id(m) == point.val_text
    assert val_documents(other) == val_documents(trained.data)
