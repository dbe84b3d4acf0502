"""The held-out split as text: its bytes recorded at prepare, its documents decoded back whole
(across shards too), and the byte count of folders prepared before it was recorded."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydoc_data.topics import topics

from lab import corpus
from lab.config import UserError
from lab.corpus import shards
from lab.corpus.valtext import val_bytes, val_documents
from splits import split_parts

SMALL_VOCAB = 512


@pytest.fixture
def lab_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def held_out_texts(name: str) -> list[str]:
    """The texts the split rule holds out, read from the constellation's sources."""
    return split_parts(name)[1]


def test_prepare_records_the_bytes_of_the_held_out_text(lab_home):
    folder = corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    m = corpus.read_manifest(folder)
    held_out = held_out_texts("pydoc")
    assert m["val_bytes"] == m["constellations"]["pydoc"]["val_bytes"] == sum(len(t.encode()) for t in held_out)
    assert val_documents(folder, "pydoc") == held_out == val_documents(folder)


def test_a_document_that_runs_on_into_the_next_shard_is_decoded_whole(lab_home, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 3_000)
    folder = corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    assert len(corpus.read_manifest(folder)["val"]) > 2
    assert val_documents(folder, "pydoc") == held_out_texts("pydoc")


def test_a_carved_tail_counts_the_bytes_it_decodes_to(lab_home):
    text = "\n".join(topics[t] for t in sorted(topics)[:20])
    (lab_home / "one.txt").write_text(text, encoding="utf-8")
    corpus.add_constellation("one", ["one.txt"])
    folder = corpus.prepare(["one"], vocab=SMALL_VOCAB, progress=False)
    [tail] = val_documents(folder, "one")
    assert text.endswith(tail) and len(tail) > 1000
    assert corpus.read_manifest(folder)["val_bytes"] == len(tail.encode())


def test_a_folder_prepared_before_val_bytes_were_recorded_is_counted_from_its_shards(lab_home, tmp_path):
    folder = corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    old = tmp_path / "old-data"
    shutil.copytree(folder, old)
    m = json.loads((old / "manifest.json").read_text())
    recorded = m.pop("val_bytes")
    for c in m["constellations"].values():
        c.pop("val_bytes")
    (old / "manifest.json").write_text(json.dumps(m))
    assert val_bytes(old) == recorded == val_bytes(folder)


def test_a_constellation_the_folder_does_not_hold_is_refused(lab_home):
    folder = corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    with pytest.raises(UserError, match="holds no constellation 'bible-ru'"):
        val_documents(folder, "bible-ru")
