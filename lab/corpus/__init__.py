"""Constellations, the tokenizer and token shards: `lab prepare`.

By concern: `constellations` (the named groups of sources and their content hashes),
`tokenizer` (train, store, reuse), `shards` (the held-out split and the uint16 shards),
`prepared` (`prepare`: a selection into one data folder), `manifests` (the one reader of prepared
folders and manifests, with where each source's text went: `source_splits`), `builtin` (the
texts shipped with the kit), `folders`.

The package's public names are read lazily from the module that defines them, so importing
`lab.corpus` or `lab.corpus.manifests` pulls in neither numpy nor sentencepiece: the
calculator asks on every keystroke."""
from __future__ import annotations

import importlib

# public name -> the module that defines it
_WHERE = {
    **dict.fromkeys(("Document", "Constellation", "Scan", "load_constellations", "get_constellations",
                     "add_constellation", "source_files", "source_documents", "scan"), "constellations"),
    **dict.fromkeys(("DEFAULT_VOCAB", "MAX_VOCAB", "EOS_ID", "TokenizerInfo", "train_tokenizer", "list_tokenizers",
                     "reusable_tokenizer", "load_tokenizer", "fitted_vocab"), "tokenizer"),
    **dict.fromkeys(("SHARD_TOKENS", "Split", "choose_val", "val_fraction", "tail_start", "ShardWriter"), "shards"),
    **dict.fromkeys(("val_set_id", "find_prepared", "prepare"), "prepared"),
    **dict.fromkeys(("FORMAT", "read_manifest", "prepared_folders", "data_id_of", "write_manifest", "SourceSplit",
                     "source_splits", "source_splits_by_constellation", "vocab_note", "shard_folder"), "manifests"),
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'lab.corpus' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lab.corpus.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted(_WHERE)
