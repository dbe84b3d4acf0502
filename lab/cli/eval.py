"""`lab eval RUN --text FILE|DIR | --constellation NAME`: loss per token and bits per byte."""
from __future__ import annotations

import argparse
import json
import sys

from lab.api import models


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN|CHECKPOINT", help="a run (id, unique prefix or folder) or a ckpt_*.pt file")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", metavar="FILE|DIR", help="a UTF-8 text file, or a folder of them (each file one document)")
    what.add_argument("--constellation", metavar="NAME", help="the held-out val split of a prepared constellation")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    loaded = models.load(args.target)
    if args.text:
        source, documents = args.text, [text for _, text in models.text_documents(args.text)]
    else:
        folder, documents = models.constellation_val(args.constellation, loaded.cfg, loaded.meta.get("val_set"))
        source = f"the val split of {args.constellation} ({folder})"
    score = models.score(loaded, documents)
    if args.json:
        print(json.dumps({"checkpoint": str(loaded.checkpoint), "step": loaded.meta["step"], "text": source,
                          **score.to_dict()}, ensure_ascii=False))
        return 0
    print(f"# {loaded.checkpoint} (step {loaded.meta['step']:,}), {loaded.device.type} {loaded.precision}",
          file=sys.stderr)
    print(f"text            {source}: {score.documents:,} document(s)")
    print(f"read            {score.bytes:,} bytes, {score.tokens:,} tokens ({score.bytes / score.tokens:.2f} bytes a token)")
    print(f"loss            {score.loss:.4f} nats per token")
    print(f"bits per byte   {score.bpb:.4f}")
    return 0
