"""What the calculator reads from the lab home: data manifests and checkpoint sidecars,
cached by mtime (the form asks on every keystroke), and what they say about a run."""
from __future__ import annotations

from pathlib import Path

from lab.config import RunConfig, UserError
from lab.corpus.manifests import prepared_folders, read_json_cached, read_manifest
from lab.sizing.cards import DEFAULT_VOCAB


def find_manifest(cfg: RunConfig) -> dict | None:
    """The prepared data's manifest for the run: `data_dir`'s when set, else the newest
    folder prepared for exactly the selected constellations. None when nothing is."""
    if cfg.data_dir:
        try:
            return read_manifest(cfg.data_dir)
        except UserError:
            return None
    names = set(cfg.constellations)
    return next((m for _, m in prepared_folders() if set(m["constellations"]) == names), None)


def checkpoint_info(target: str) -> dict | None:
    """{"step", "config", "path"} of the checkpoint a run would continue from, read from
    its sidecar `ckpt_<step>.json` (written by `lab.checkpoint.save`; no torch needed):
    the file itself, or the newest in a run folder or its `checkpoints/`."""
    path = Path(target).expanduser()
    if path.suffix == ".pt":
        sidecars = [path.with_suffix(".json")]
    else:
        sidecars = []
        for folder in (path, path / "checkpoints"):
            try:
                sidecars += sorted(p for p in folder.iterdir() if p.name.startswith("ckpt_") and p.suffix == ".json")
            except OSError:
                pass
    for sidecar in reversed(sidecars):
        meta = read_json_cached(sidecar)
        if isinstance(meta, dict) and isinstance(meta.get("step"), int):
            return {"step": meta["step"], "config": meta.get("config") or {}, "path": str(sidecar.with_suffix(".pt"))}
    return None


def resolve_vocab(vocab: int | None, manifest: dict | None, ckpt: dict | None) -> tuple[int, str]:
    if vocab is not None:
        return int(vocab), "given"
    ckpt_vocab = ((ckpt or {}).get("config") or {}).get("vocab")
    if isinstance(ckpt_vocab, int):
        return ckpt_vocab, "checkpoint"
    mvocab = ((manifest or {}).get("tokenizer") or {}).get("vocab")
    if isinstance(mvocab, int):
        return mvocab, "manifest"
    return DEFAULT_VOCAB, "default"


def tokens_available(cfg: RunConfig, manifest: dict | None) -> int | None:
    """Training tokens of the selected constellations in the manifest (all of it for a
    `data_dir` run, or when the manifest does not break them down)."""
    if not manifest:
        return None
    per = manifest.get("constellations")
    if isinstance(per, dict) and per and not cfg.data_dir:
        counts = [per[n].get("train_tokens") for n in cfg.constellations if isinstance(per.get(n), dict)]
        counts = [c for c in counts if isinstance(c, int)]
        return sum(counts) if counts else None
    total = manifest.get("train_tokens")
    return total if isinstance(total, int) else None


