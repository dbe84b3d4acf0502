"""A trained model loaded for use: from a run (its newest whole checkpoint) or a checkpoint
file, with the tokenizer it was trained with, on this computer's GPU or CPU.

The checkpoint is loaded as data (`load_checkpoint`: tensors and plain values, never code).
Its tokenizer is found by the sha256 the checkpoint recorded: in the run's data folder, any
prepared data folder, or the lab's tokenizers. On a CPU the model runs in fp32; on a GPU in
the card's precision (bf16 from compute capability 8.0, else fp16), as training did.
"""
from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch

from lab.config import RunConfig, UserError
from lab.corpus.manifests import prepared_folders, read_manifest
from lab.corpus.tokenizer import list_tokenizers
from lab.kernel.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from lab.kernel.model import GPT
from lab.kernel.step import pick_precision
from lab.runs import RECORD, Run, load_run


@dataclass
class Loaded:
    model: GPT
    tokenizer: spm.SentencePieceProcessor
    tokenizer_file: Path
    checkpoint: Path
    meta: dict  # what the checkpoint holds beside the weights: step, tokens, config, val_set, ...
    run: Run | None  # the run the checkpoint belongs to, when it lies in one
    device: torch.device
    precision: str

    @property
    def cfg(self) -> RunConfig:
        return RunConfig.from_dict(self.meta["config"])

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id()

    def autocast(self):
        """The forward's precision: fp32 as it is, else autocast to the card's type."""
        if self.precision == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.float16 if self.precision == "fp16" else torch.bfloat16)


def find_checkpoint(target: str | os.PathLike) -> tuple[Path, Run | None]:
    """The checkpoint a run id, a run folder or a checkpoint file stands for, and its run."""
    path = Path(target).expanduser()
    if path.is_file():
        run = _run_of(path.parent.parent if path.parent.name == "checkpoints" else path.parent)
    elif (path / RECORD).is_file():
        run = load_run(str(path))
    elif path.is_dir():
        run = None
    else:
        run = load_run(str(target))
        path = run.folder
    try:
        return resolve_checkpoint(path), run
    except CheckpointError as e:
        name = f"run {run.id}" if run is not None else str(path)
        raise UserError(f"{name} has no usable checkpoint yet ({e}); a run saves one every "
                        f"checkpoint_every_min minutes and when it stops: wait for it, or pick another run "
                        f"(lab runs)") from None


def _run_of(folder: Path) -> Run | None:
    return load_run(str(folder)) if (folder / RECORD).is_file() else None


def find_tokenizer(sha256: str, cfg: RunConfig) -> Path:
    """The tokenizer.model whose sha256 the checkpoint recorded."""
    candidates = []
    if cfg.data_dir:
        try:
            candidates.append((Path(cfg.data_dir), read_manifest(cfg.data_dir)))
        except UserError:
            pass
    for folder, manifest in candidates + prepared_folders():
        tok = manifest.get("tokenizer") or {}
        if tok.get("sha256") == sha256 and (folder / tok.get("file", "tokenizer.model")).is_file():
            return folder / tok.get("file", "tokenizer.model")
    for info in list_tokenizers():
        if info.sha256 == sha256:
            return info.model_file
    raise UserError(f"the tokenizer this model was trained with (sha256 {sha256[:12]}…) is not in this lab home: "
                    f"prepare the run's constellations ({'+'.join(cfg.constellations)}) with `lab prepare`, "
                    f"or copy its data folder into {Path('$LAB_HOME') / 'data'}")


def pick_device(device: str | None = None) -> tuple[torch.device, str]:
    """(the device, its precision): a GPU when there is one, in the card's precision; else fp32."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cuda":
        return dev, "fp32"
    return dev, pick_precision(dev)


def load_model(target: str | os.PathLike, device: str | None = None) -> Loaded:
    """The model of a run or checkpoint, in eval mode on `device` (default: a GPU, else the CPU)."""
    path, run = find_checkpoint(target)
    state = load_checkpoint(path)
    weights = state.pop("model")
    meta = {k: v for k, v in state.items() if k not in ("optimizer", "scaler", "rng")}
    cfg = RunConfig.from_dict(meta["config"])
    tokenizer_file = find_tokenizer(meta["tokenizer_sha256"], cfg)
    dev, precision = pick_device(device)
    model = GPT(weights["tok.weight"].size(0), cfg.context, cfg.width, cfg.heads, cfg.layers)
    model.load_state_dict(weights)
    try:
        model.to(dev).eval()
    except torch.cuda.OutOfMemoryError:
        raise UserError(f"the GPU has no room for this model ({model.num_weights():,} weights): a run may be "
                        f"training on it; wait for it to end, or use the CPU") from None
    return Loaded(model, spm.SentencePieceProcessor(model_file=str(tokenizer_file)), tokenizer_file, path, meta,
                  run, dev, precision)
