"""`lab export RUN [--out DIR]`: safetensors weights, config, tokenizer and a model card, in a
folder that Hugging Face transformers loads too."""
from __future__ import annotations

import argparse

from lab.api import models


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN|CHECKPOINT", help="a run (id, unique prefix or folder) or a ckpt_*.pt file")
    parser.add_argument("--out", metavar="DIR", help="the folder to write (new); default $LAB_HOME/exports/RUN-stepN")


def run(args: argparse.Namespace) -> int:
    out = models.export(args.target, args.out)
    print(f"exported {out}")
    print(f"model card {out / models.CARD} (with the lines that load it back)")
    print(f"in Hugging Face transformers ({models.INSTALL}):")
    print("    " + models.LOAD_LINES.format(out=out).replace("\n", "\n    "))
    return 0
