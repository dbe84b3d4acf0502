"""Bits per byte on any text: a hand computation agrees, windows past the context count each
token once, and a constellation's val split measures as prepared."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import lab_here
from lab.models.evaluate import evaluate, token_losses, token_stream

TINY_TEXTS = ["Ёж «да»\n", "x = 1  # 🐍\n"]  # with three EOS: 30 tokens, within the context 32


def test_bits_per_byte_on_a_tiny_text_is_the_hand_computation(loaded):
    sp, eos = loaded.tokenizer, loaded.eos_id
    ids = [eos] + sp.encode(TINY_TEXTS[0]) + [eos] + sp.encode(TINY_TEXTS[1]) + [eos]
    assert len(ids) <= loaded.model.context + 1  # one window: each loss by hand from one forward pass
    with torch.no_grad():
        logp = F.log_softmax(loaded.model(torch.tensor([ids[:-1]]))[0].double(), dim=-1)
    losses = [-float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    n_bytes = len(TINY_TEXTS[0].encode()) + len(TINY_TEXTS[1].encode())
    score = evaluate(loaded, TINY_TEXTS)
    assert (score.tokens, score.bytes, score.documents) == (len(ids) - 1, n_bytes, 2)
    assert score.loss == pytest.approx(sum(losses) / len(losses), rel=1e-6)
    assert score.bpb == pytest.approx(sum(losses) / math.log(2) / n_bytes, rel=1e-6)


def test_a_text_longer_than_the_context_is_scored_in_windows_each_token_once(loaded):
    n = loaded.model.context
    ids = token_stream(loaded, ["The for statement is used to iterate over the elements of a sequence. " * 8])
    assert len(ids) > 3 * n
    losses = token_losses(loaded, ids, rows=2)  # batches of two windows and a short last one
    assert len(losses) == len(ids) - 1
    with torch.no_grad():  # window 2 by itself: ids[2n : 3n + 1] gives the losses of ids[2n+1 .. 3n]
        logits = loaded.model(torch.tensor([ids[2 * n:3 * n]]))[0]
    alone = F.cross_entropy(logits.float(), torch.tensor(ids[2 * n + 1:3 * n + 1]), reduction="none")
    torch.testing.assert_close(losses[2 * n:3 * n].float(), alone, rtol=1e-5, atol=1e-5)
    assert torch.equal(token_losses(loaded, ids, rows=8), token_losses(loaded, ids, rows=8))


def test_lab_eval_on_a_file_a_folder_and_a_constellations_val_split(trained, tmp_path):
    (tmp_path / "a.txt").write_text(TINY_TEXTS[0], encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text(TINY_TEXTS[1], encoding="utf-8")
    (tmp_path / "skip.bin").write_bytes(b"\xff\x00")
    code, out, err = lab_here("eval", trained.run.id, "--text", str(tmp_path / "a.txt"), "--json")
    assert code == 0, err
    one = json.loads(out)
    assert one["bytes"] == len(TINY_TEXTS[0].encode()) and one["documents"] == 1
    code, out, _ = lab_here("eval", trained.run.id, "--text", str(tmp_path), "--json")
    both = json.loads(out)
    assert both["documents"] == 2 and both["bytes"] == sum(len(t.encode()) for t in TINY_TEXTS)
    code, out, _ = lab_here("eval", trained.run.id, "--constellation", "pydoc")
    manifest = json.loads((trained.data / "manifest.json").read_text())
    assert code == 0
    assert f"{manifest['constellations']['pydoc']['val_bytes']:,} bytes, {manifest['val_tokens']:,} tokens" in out
    assert "bits per byte" in out and "nats per token" in out


def test_a_text_that_is_not_utf8_is_refused_clearly(trained, tmp_path):
    bad = tmp_path / "cp1251.txt"
    bad.write_bytes("Привет".encode("cp1251"))
    code, _, err = lab_here("eval", trained.run.id, "--text", str(bad))
    assert code == 2
    assert "is not UTF-8 text" in err and "convert it to UTF-8" in err and "Traceback" not in err


def test_a_constellation_that_is_not_prepared_is_refused_clearly(trained):
    code, _, err = lab_here("eval", trained.run.id, "--constellation", "bible-ru")
    assert code == 2 and "lab prepare -c bible-ru" in err
