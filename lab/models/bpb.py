"""Bits per byte: a loss that does not depend on the tokenizer.

A model's loss in nats per token says how well it predicts *its* tokens; tokenizers cut the
same text into different numbers of tokens, so losses of runs with different tokenizers or
vocabularies do not compare. Bits per byte do: the nats of the whole text, in bits, over
its UTF-8 bytes. For a run's val loss (a mean over the val windows) the bytes per token are
the val split's average: bpb = val_loss · val_tokens / val_bytes / ln 2.

Stdlib only, except where a data folder prepared before its manifest kept `val_bytes` must
be decoded once (`lab.corpus.valtext`): `lab runs` and the runs panel ask for every run.
"""
from __future__ import annotations

import math
from pathlib import Path

from lab.config import RunConfig, UserError
from lab.corpus.manifests import prepared_folders, read_manifest


def bits_per_byte(nats: float, n_bytes: int) -> float:
    """The bits per byte of a text whose tokens cost `nats` in all (the sum of their losses)."""
    return nats / math.log(2) / n_bytes


def last_val(rows: list[dict]) -> dict | None:
    """The newest metrics row with a val loss."""
    return next((r for r in reversed(rows) if isinstance(r.get("val_loss"), (int, float))), None)


def data_folder_of(val_set: str | None, cfg: RunConfig) -> Path | None:
    """The prepared data folder of a val set (a metrics row names the one it was measured on);
    the run's own data folder when the row names none. None when this lab home has neither."""
    if val_set:
        found = next((folder for folder, m in prepared_folders() if m.get("val_set") == val_set), None)
        if found is not None:
            return found
    if cfg.data_dir:
        try:
            manifest = read_manifest(cfg.data_dir)
        except UserError:
            return None
        if not val_set or manifest.get("val_set") == val_set:
            return Path(cfg.data_dir)
    return None


def val_bpb(row: dict | None, cfg: RunConfig) -> float | None:
    """Bits per byte of a metrics row's val loss, from its val split's tokens and bytes; None
    when the row has no val loss or its data is not in this lab home."""
    if row is None or not isinstance(row.get("val_loss"), (int, float)):
        return None
    folder = data_folder_of(row.get("val_set"), cfg)
    if folder is None:
        return None
    from lab.corpus.valtext import val_bytes  # numpy, sentencepiece: only where the data is at hand
    try:
        tokens, n_bytes = read_manifest(folder)["val_tokens"], val_bytes(folder)
    except (UserError, OSError, KeyError):
        return None
    return bits_per_byte(row["val_loss"] * tokens, n_bytes) if n_bytes else None
