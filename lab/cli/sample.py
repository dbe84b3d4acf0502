"""`lab sample RUN|CHECKPOINT`: text from a trained model, printed as it is generated."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.api import models
from lab.config import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN|CHECKPOINT", help="a run (id, unique prefix or folder) or a ckpt_*.pt file")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default="", metavar="TEXT", help="the text to continue (default: none)")
    prompt.add_argument("--prompt-file", metavar="F", help="read the prompt from a UTF-8 file")
    parser.add_argument("--tokens", type=int, default=200, metavar="N", help="new tokens per sample, at most (200)")
    parser.add_argument("--temperature", type=float, default=0.8, metavar="T", help="lower is more predictable; 0: greedy, the likeliest token (0.8)")
    parser.add_argument("--top-k", type=int, default=50, metavar="K", help="sample among the K likeliest tokens; 0: all (50)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="... and among the fewest whose probability reaches P; 1: no cut (1.0)")
    parser.add_argument("--seed", type=int, default=1337, metavar="S", help="the same seed gives the same text (1337)")
    parser.add_argument("--num-samples", type=int, default=1, metavar="M", help="samples, seeded S, S+1, ... (1)")


def run(args: argparse.Namespace) -> int:
    settings = models.Settings(tokens=args.tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, samples=args.num_samples).check()
    prompt = _prompt(args)
    loaded = models.load(args.target)
    print(f"# {loaded.checkpoint} (step {loaded.meta['step']:,}), {loaded.device.type} {loaded.precision}",
          file=sys.stderr)
    for i in range(settings.samples):
        if i:
            print("\n---")
        sys.stdout.write(prompt)
        for piece in models.sample(loaded, prompt, settings, index=i):
            sys.stdout.write(piece)
            sys.stdout.flush()
        print()
    return 0


def _prompt(args: argparse.Namespace) -> str:
    if not args.prompt_file:
        return args.prompt
    text = models.read_text_file(Path(args.prompt_file).expanduser())
    if not text.strip():
        raise UserError(f"the prompt file {args.prompt_file} is empty: write the text to continue into it, "
                        f"or leave --prompt-file out for an unprompted sample")
    return text
