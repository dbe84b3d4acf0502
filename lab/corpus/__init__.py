"""Constellations, the tokenizer and token shards: `lab prepare`.

The package's public names are read lazily from the module that defines them, so
`lab.corpus.manifests` (no numpy, no sentencepiece) stays light for the calculator."""
from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("lab.corpus.core"), name)
