"""One's own texts in training: every source gives its share to val, a text too small for the
lab's vocabulary gets one that fits, and a constellation may have a Cyrillic name."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from pydoc_data.topics import topics

from lab import cli, corpus
from lab.config import UserError
from lab.corpus import shards
from lab.corpus.manifests import source_splits, source_splits_by_constellation, vocab_note
from lab.corpus.valtext import val_documents
from splits import split_parts

WORDS = ("жил был старик со старухой попросил испеки колобок она по амбару помела по сусекам поскребла "
         "набрала муки горсти две замесила на сметане изжарила в масле положила на окошко простынуть "
         "лиса заяц волк медведь песенку пел катился по дорожке ёлка").split()


@pytest.fixture
def lab_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def write_tales(folder: Path, count: int = 6, lines: int = 40, seed: int = 0) -> list[Path]:
    """Short tales of made-up Russian lines, ~4 KB each."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(10)) for _ in range(lines)) + "\n"
        paths.append(folder / f"сказка-{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    return paths


def big_file(path: Path) -> Path:
    path.write_text("\n".join(topics[t] for t in sorted(topics)[:60]), encoding="utf-8")
    return path


# --- every source gives its share ----------------------------------------------------------

def test_six_short_tales_beside_one_large_file_each_give_their_share_to_val(lab_home):
    tales = write_tales(lab_home / "texts" / "tales")
    big_file(lab_home / "texts" / "tales" / "big.txt")
    corpus.add_constellation("mine", ["texts/tales/"])
    folder = corpus.prepare(["mine"], vocab=600, progress=False)
    m = corpus.read_manifest(folder)
    fraction = shards.val_fraction(m["constellations"]["mine"]["bytes"])

    # Each file, the tales and the large one, trains on its head and is measured on its tail,
    # near the constellation's share; none is held out whole.
    texts = {p.name: p.read_text(encoding="utf-8") for p in [*tales, lab_home / "texts/tales/big.txt"]}
    train, val = split_parts("mine")
    assert val_documents(folder, "mine") == val and len(val) == 7
    for name, text in texts.items():
        [tail] = [v for v in val if text.endswith(v)]
        assert text[:-len(tail)] in train
        assert abs(len(tail.encode()) / len(text.encode()) - fraction) < 0.3 * fraction, name
    # The manifest and `lab prepare` say where the folder's text went.
    [split] = source_splits(m)
    assert (split.source, split.documents, split.val_tails, split.val_whole) == ("texts/tales/", 7, 7, 0)
    assert split.train_bytes + split.val_bytes == split.bytes == sum(len(t.encode()) for t in texts.values())
    assert split.val_bytes == m["val_bytes"] and split.val_tokens == m["val_tokens"]
    assert "7 of 7 documents give their last part" in split.words()
    assert "у 7 из 7 документов отложен конец" in split.words("ru")


def test_each_source_of_a_constellation_gives_the_same_share(lab_home, capsys):
    write_tales(lab_home / "tales")
    big_file(lab_home / "big.txt")
    (lab_home / "note.txt").write_text("Жил-был Колобок.\n" * 20, encoding="utf-8")  # a few hundred bytes
    corpus.add_constellation("mine", ["tales/", "big.txt", "note.txt"])
    assert cli.main(["prepare", "-c", "mine", "--vocab", "600", "-q"]) == 0
    out = capsys.readouterr().out
    m = corpus.read_manifest(corpus.find_prepared(["mine"]))
    fraction = shards.val_fraction(m["constellations"]["mine"]["bytes"])
    splits = source_splits(m)
    assert [s.source for s in splits] == ["tales/", "big.txt", "note.txt"]
    for s in splits:
        assert s.train_tokens > s.val_tokens > 0 and abs(s.val_share - fraction) < 0.3 * fraction, s
        assert f"    {s.words()}" in out  # under its constellation's line
    assert sum(s.val_tokens for s in splits) == m["val_tokens"]
    assert source_splits_by_constellation()["mine"] == splits  # what the Data panel shows

    assert cli.main(["prepare", "--list"]) == 0
    listing = capsys.readouterr().out
    assert all(s.words() in listing for s in splits)


def test_a_source_of_many_small_documents_holds_some_out_whole(lab_home):
    notes = lab_home / "notes"
    notes.mkdir()
    rng = random.Random(1)
    for i in range(120):  # a folder of short notes of about the same size
        (notes / f"{i:03d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(60)), encoding="utf-8")
    corpus.add_constellation("notes", ["notes/"])
    c = corpus.get_constellations(["notes"])["notes"]
    s = corpus.scan(c)
    split = corpus.choose_val(s.doc_hashes, s.doc_bytes, s.doc_sources)
    assert not split.tails and 0.5 * split.fraction < len(split.whole) / 120 < 1.5 * split.fraction
    assert corpus.choose_val(s.doc_hashes, s.doc_bytes, s.doc_sources) == split  # the same text, the same split


def test_a_single_tiny_document_still_gets_a_val_split(lab_home):
    text = "Жили-были дед да баба. Была у них курочка Ряба.\nСнесла курочка яичко, не простое — золотое.\n" * 3
    (lab_home / "ryaba.txt").write_text(text, encoding="utf-8")
    corpus.add_constellation("ряба", ["ryaba.txt"])
    folder = corpus.prepare(["ряба"], progress=False)  # a few hundred bytes: a vocabulary that fits too
    m = corpus.read_manifest(folder)
    [tail] = val_documents(folder, "ряба")
    assert text.endswith(tail) and 0 < len(tail) < len(text) / 3 and tail[0] in "СЖ"  # a line of its own
    assert m["train_tokens"] > m["val_tokens"] > 1 and m["val_bytes"] == len(tail.encode())
    assert shards.tail_start("ё".encode(), 0.2) == 0  # one character cannot be cut


def test_a_document_of_one_character_is_no_val_set(lab_home):
    tok = corpus.read_manifest(corpus.prepare(["pydoc"], vocab=600, progress=False))["tokenizer"]["tok_id"]
    (lab_home / "one.txt").write_text("😀", encoding="utf-8")
    corpus.add_constellation("one", ["one.txt"])
    with pytest.raises(UserError, match="too small to hold out a val set") as e:
        corpus.prepare(["one"], progress=False, tokenizer=tok)
    assert "добавьте текста" in e.value.ru


def test_data_prepared_by_the_old_split_rule_is_prepared_again(lab_home):
    folder = corpus.prepare(["pydoc"], vocab=600, progress=False)
    manifest = folder / "manifest.json"
    manifest.write_text(manifest.read_text().replace(shards.SPLIT_RULE, "whole-docs-by-sha256/5%/eos-after-doc/v1"))
    assert corpus.find_prepared(["pydoc"]) is None  # its val set took small sources whole


# --- a vocabulary that fits -------------------------------------------------------------------

def test_a_small_text_gets_a_vocabulary_that_fits_and_says_so(lab_home, capsys):
    write_tales(lab_home / "tales", count=6, lines=60)  # ~23 KB
    corpus.add_constellation("tales", ["tales/"])
    told = []
    folder = corpus.prepare(["tales"], progress=lambda stage, done, total: told.append(stage) if total is None else 0)
    tok = corpus.read_manifest(folder)["tokenizer"]
    assert tok["asked_vocab"] == corpus.DEFAULT_VOCAB and 300 <= tok["vocab"] < corpus.DEFAULT_VOCAB
    assert any(f"vocab {corpus.DEFAULT_VOCAB} is too large" in s and f"training vocab {tok['vocab']}" in s for s in told)
    en, ru = vocab_note(corpus.read_manifest(folder))
    assert f"vocab {tok['vocab']}, not {corpus.DEFAULT_VOCAB}" in en and f"словарь {tok['vocab']}" in ru
    # Asked again, the same data is found: nothing is trained twice.
    told.clear()
    assert corpus.prepare(["tales"], progress=lambda stage, d, total: told.append(stage) if total is None else 0) == folder
    assert told[-1] == f"already prepared: {folder}" and not any("training" in s for s in told)
    # The command says it too; a vocab given is taken as given.
    assert cli.main(["prepare", "-c", "tales", "-q"]) == 0
    assert f"vocab: {tok['vocab']}" in capsys.readouterr().out and "not 4000" in en
    with pytest.raises(UserError, match="vocab 4000 is too large for this text") as e:
        corpus.prepare(["tales"], vocab=4000, progress=False)
    assert "словарь 4000 слишком велик" in e.value.ru


# --- names ------------------------------------------------------------------------------------

def test_a_constellation_may_have_a_cyrillic_name(lab_home):
    write_tales(lab_home / "tales", count=2)
    corpus.add_constellation("сказки-ёлка", ["tales/"])
    folder = corpus.prepare(["сказки-ёлка"], vocab=300, progress=False)
    m = corpus.read_manifest(folder)
    assert folder.name.startswith("сказки-ёлка-") and list(m["constellations"]) == ["сказки-ёлка"]
    assert all(e["path"].isascii() for e in m["train"] + m["val"])  # the file names of a Kaggle dataset
    assert val_documents(folder, "сказки-ёлка") == split_parts("сказки-ёлка")[1]


@pytest.mark.parametrize("name", ["a b", "a/b", "a\\b", ".hidden", "-x", "x.", "a+b", "con", "NUL.txt", "", "a:b"])
def test_names_a_folder_cannot_carry_are_refused_in_both_languages(lab_home, name):
    with pytest.raises(UserError, match="a name is letters, digits") as e:
        corpus.add_constellation(name, ["builtin:pydoc"])
    assert "буквы, цифры" in e.value.ru
