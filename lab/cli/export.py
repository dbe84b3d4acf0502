"""`lab export RUN [--out DIR]`: safetensors weights, config, tokenizer and a model card."""
from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN|CHECKPOINT", help="a run (id, unique prefix or folder) or a ckpt_*.pt file")
    parser.add_argument("--out", metavar="DIR", help="the folder to write (new); default $LAB_HOME/exports/RUN-stepN")


def run(args: argparse.Namespace) -> int:
    from lab.models.export import CARD, export
    out = export(args.target, args.out)
    print(f"exported {out}")
    print(f"model card {out / CARD} (with the lines that load it back)")
    return 0
