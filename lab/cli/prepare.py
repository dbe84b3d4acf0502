"""`lab prepare`: train the tokenizer and write token shards for constellations.

    lab prepare -c pydoc [-c bible-ru ...] [--vocab 4000] [--tokenizer auto|new|TOK_ID] [-q]
    lab prepare --list

Both say per source how much of its text went to train and how much to val.
"""
from __future__ import annotations

import argparse

from lab.api import data
from lab.config import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--constellation", action="append", default=[], metavar="NAME",
                        help="a constellation to prepare (repeat, or separate with commas)")
    parser.add_argument("--vocab", type=int, default=None,
                        help=f"tokenizer vocabulary size, at most {data.MAX_VOCAB} (default {data.DEFAULT_VOCAB}, "
                             f"lowered for a text too small for it; a vocab given is taken as given)")
    parser.add_argument("--tokenizer", default="auto", metavar="auto|new|TOK_ID",
                        help="auto: reuse one trained on a subset of the selection, else train (default); "
                             "new: one trained on exactly this selection; TOK_ID: that tokenizer")
    parser.add_argument("--list", action="store_true", help="list the known constellations and what is prepared")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    if args.list:
        print_list()
        return 0
    names = [n for value in args.constellation for n in value.split(",") if n.strip()]
    if not names:
        raise UserError("say which constellations to prepare: lab prepare -c NAME (lab prepare --list shows them)")
    folder = data.prepare(names, vocab=args.vocab, progress=not args.quiet, tokenizer=args.tokenizer)
    m = data.manifest(folder)
    tok = m["tokenizer"]
    print(f"data folder: {folder}")
    print(f"tokens: train {m['train_tokens']:,}, val {m['val_tokens']:,} "
          f"(shortest val split {m['shortest_val_tokens']:,})")
    for name, c in m["constellations"].items():
        print(f"  {name}: {c['bytes']:,} bytes, {c['documents']:,} documents, "
              f"train {c['train_tokens']:,}, val {c['val_tokens']:,} tokens")
        for split in data.splits(m):
            if split.constellation == name:
                print(f"    {split.words()}")
    note = data.prepared_note(folder)
    print(f"vocab: {tok['vocab']} (tokenizer {tok['tok_id']}, trained on {', '.join(tok['trained_on'])})"
          + (f"; {note[0]}" if note else ""))
    print(f"val_set: {m['val_set']}")
    return 0


def print_list() -> None:
    for c in data.constellations():
        print(f"{c.name}" + (f": {c.description}" if c.description else ""))
        print(f"  sources: {', '.join(c.sources)}")
        state, current = data.prepared_state(c.name)
        print(f"  prepared: {state}")
        if current:  # the newest folder's split, source by source
            for split in data.splits(current):
                if split.constellation == c.name:
                    print(f"    {split.words()}")
