"""A trained model in use: a run's (or a checkpoint's) model loaded with its tokenizer, text
sampled from it and streamed, its loss and bits per byte on any text, and its export (safetensors,
a model card, a folder transformers loads). Importing this module imports torch.

    load(target)                       a run (id, prefix, folder) or a ckpt_*.pt, ready to sample
    sample(loaded, prompt, settings)   the text after the prompt, piece by piece as it is generated
    score(loaded, documents)           loss per token and bits per byte
    export(target, out)                the folder; EXPORT_LINES say how transformers loads it
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from lab.config import UserError
from lab.models.evaluate import Score, evaluate
from lab.models.export import CARD
from lab.models.export import export as export_folder
from lab.models.hf import INSTALL, LOAD_LINES
from lab.models.loading import Loaded, load_model
from lab.models.sampling import Settings, generate
from lab.models.texts import constellation_val, read_text_file, text_documents

__all__ = ["CARD", "INSTALL", "LOAD_LINES", "Loaded", "Score", "Settings", "constellation_val", "export", "load",
           "read_text_file", "sample", "score", "text_documents"]


def load(target: str) -> Loaded:
    """The model of a run (id, unique prefix, folder) or of a checkpoint file; a file named that is
    not there is said as a missing file, not as an unknown run."""
    _file_there(target)
    return load_model(target)


def _file_there(target: str) -> None:
    path = Path(target).expanduser()
    if (path.suffix == ".pt" or "/" in target or "\\" in target) and not path.exists():
        raise UserError(f"{target}: no such file; give a checkpoint file that exists (a run's "
                        f"checkpoints/ckpt_*.pt) or a run (`lab runs` lists them)",
                        ru=f"{target}: такого файла нет; укажите существующий файл чекпоинта (checkpoints/ckpt_*.pt "
                           f"прогона) или прогон")


def sample(loaded: Loaded, prompt: str, settings: Settings, index: int = 0) -> Iterator[str]:
    """The text after `prompt`, streamed as whole characters while it is generated."""
    return generate(loaded, prompt, settings, index=index)


def score(loaded: Loaded, documents: list[str]) -> Score:
    return evaluate(loaded, documents)


def export(target: str, out: str | None = None) -> Path:
    _file_there(target)
    return export_folder(target, out)
