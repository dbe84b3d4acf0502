"""`lab export`: a trained model as files any PyTorch stack can read, with no pickle.

    model.safetensors   the weights (safetensors: a JSON header and raw tensors, never code)
    config.json         the model's sizes as `GPT(**config["model"])` takes them, the EOS id,
                        the tokenizer's sha256, the checkpoint's step and tokens, the run's fields;
                        and transformers' fields beside them
    tokenizer.model     the sentencepiece tokenizer it was trained with
    README.md           the model card (`lab.models.card`)

and what Hugging Face transformers loads it with (`lab.models.hf`): the model's code, a
tokenizer.json, generation defaults. The kit writes them all without transformers installed.

The folder is written under a temporary name and renamed into place whole.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from lab.config import UserError
from lab.corpus.folders import atomic_folder
from lab.corpus.manifests import read_manifest
from lab.home import lab_home
from lab.kernel.metrics import read_metrics
from lab.models.bpb import data_folder_of, val_bpb
from lab.models.card import model_card
from lab.models.hf import write_hf_files
from lab.models.loading import Loaded, load_model
from lab.runs import lineage, load_run

WEIGHTS, CONFIG, TOKENIZER, CARD = "model.safetensors", "config.json", "tokenizer.model", "README.md"


def default_out(loaded: Loaded) -> Path:
    name = loaded.run.id if loaded.run is not None else loaded.checkpoint.parent.name
    return lab_home() / "exports" / f"{name}-step{loaded.meta['step']}"


def export_facts(loaded: Loaded) -> dict:
    """What config.json and the card say about the model: sizes, data, training, lineage."""
    cfg, model = loaded.cfg, loaded.model
    rows = read_metrics(loaded.run.folder) if loaded.run is not None else []
    val = next((r for r in reversed(rows) if "val_loss" in r and r["step"] <= loaded.meta["step"]), None)
    folder = data_folder_of(loaded.meta.get("val_set"), cfg)
    return {
        "name": loaded.run.id if loaded.run is not None else loaded.checkpoint.stem,
        "source": loaded.run.id if loaded.run is not None else str(loaded.checkpoint),  # what `lab sample` takes
        "model": {"vocab": model.tok.num_embeddings, "context": cfg.context, "width": cfg.width,
                  "heads": cfg.heads, "layers": cfg.layers},
        "weights": model.num_weights(), "eos_id": loaded.eos_id,
        "tokenizer_sha256": loaded.meta["tokenizer_sha256"], "step": loaded.meta["step"],
        "tokens": loaded.meta.get("tokens") or 0, "val_set": loaded.meta.get("val_set"),
        "val_loss": val and val["val_loss"], "val_step": val and val["step"], "val_bpb": val_bpb(val, cfg),
        "data": read_manifest(folder) if folder is not None else None,
        "lineage": _lineage(loaded), "training": cfg.to_dict()}


def _lineage(loaded: Loaded) -> list[str]:
    if loaded.run is None:
        return []
    out = []
    for run_id in lineage(loaded.run):
        run = load_run(run_id)
        origin = f"from {run.parent['run']} at step {run.parent['step']:,}" if (run.parent or {}).get("run") else \
            "from scratch" if not run.parent else f"from checkpoint {run.parent.get('checkpoint')}"
        step = loaded.meta["step"] if run.id == loaded.run.id else run.step  # this run: where the export is from
        out.append(f"{run.id}: {run.cfg.layers}×{run.cfg.width}, {origin}, to step {step:,}")
    return out


def export(target: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Writes the export of a run's newest checkpoint (or of a checkpoint file); returns its folder."""
    from safetensors.torch import save_file  # safetensors: only for an export
    loaded = load_model(target, device="cpu")
    final = Path(out).expanduser().resolve() if out else default_out(loaded)
    if final.exists():
        raise UserError(f"{final} exists already: remove it or give another --out",
                        ru=f"{final} уже есть: удалите эту папку или укажите другую (--out)")
    facts = export_facts(loaded)
    config = {"model": facts["model"], "eos_id": facts["eos_id"], "tokenizer": TOKENIZER,
              "tokenizer_sha256": facts["tokenizer_sha256"], "weights": facts["weights"], "step": facts["step"],
              "tokens": facts["tokens"], "val_set": facts["val_set"], "val_loss": facts["val_loss"],
              "val_bpb": facts["val_bpb"], "run": facts["name"], "training": facts["training"]}
    with atomic_folder(final.parent, final.name) as tmp:
        tensors = {k: v.contiguous() for k, v in loaded.model.state_dict().items()}
        save_file(tensors, tmp / WEIGHTS, metadata={"format": "pt", "lab": "lab.kernel.model.GPT"})
        os.chmod(tmp / WEIGHTS, 0o644)  # safetensors writes 0600; the folder is meant to be shared
        write_hf_files(tmp, config, loaded.tokenizer_file)  # config.json with transformers' fields
        shutil.copyfile(loaded.tokenizer_file, tmp / TOKENIZER)
        (tmp / CARD).write_text(model_card({**facts, "out_hint": final.name}), encoding="utf-8")
    return final
