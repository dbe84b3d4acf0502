"""The model card: the README.md of an export, what a reader needs to use the weights and to
trust them — sizes, the data and its licences, tokens seen, val loss and bits per byte, the
run's lineage, and the few lines that load it back."""
from __future__ import annotations

from datetime import datetime, timezone

from lab import __version__
from lab.models.hf import INSTALL, LOAD_LINES

LOAD_BACK = '''import json
import torch
from safetensors.torch import load_file
from lab.kernel.model import GPT

config = json.load(open("{out}/config.json"))
model = GPT(**config["model"])
model.load_state_dict(load_file("{out}/model.safetensors"))
model.eval()

import sentencepiece as spm  # and to write text:
sp = spm.SentencePieceProcessor(model_file="{out}/tokenizer.model")
start = torch.tensor([[config["eos_id"]] + sp.encode("Жили-были")])
print(sp.decode(model.generate(start, 100)[0, 1:].tolist()))'''


def model_card(facts: dict) -> str:
    """The card's Markdown from the export's facts (`lab.models.export.export_facts`)."""
    m, t = facts["model"], facts["training"]
    lines = [f"# {facts['name']}", "",
             f"A GPT trained from scratch with the lab kit (lab {__version__}); exported "
             f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from checkpoint step {facts['step']:,}.",
             "", "## Size", "",
             "| layers | width d | heads | context n | vocab | weights |", "|---|---|---|---|---|---|",
             f"| {m['layers']} | {m['width']} | {m['heads']} | {m['context']} | {m['vocab']} | {facts['weights']:,} |",
             "", "Weights = 12·layers·d² + vocab·d + n·d: no biases, norms without learned weights, the output "
             "head tied to the token embedding, learned positions, a 4·d MLP.",
             "", "## Data", ""]
    lines += _data_lines(facts.get("data"))
    lines += ["", "## Training", "",
              f"- tokens seen: {facts['tokens']:,} ({facts['step']:,} steps)",
              f"- val loss: {_num(facts.get('val_loss'))} nats per token"
              + (f" (at step {facts['val_step']:,})" if facts.get("val_step") is not None else ""),
              f"- val bits per byte: {_num(facts.get('val_bpb'))} (does not depend on the tokenizer)",
              f"- schedule {t['schedule']}, peak lr {t['lr']:g}, warmup {t['warmup_steps']} steps, "
              f"weight decay {t['weight_decay']:g}, batch {t['batch_per_card']} per card × {t['grad_accum']} "
              f"accumulation, seed {t['seed']}",
              f"- tokenizer: sentencepiece BPE with byte fallback, vocab {m['vocab']}, sha256 "
              f"`{facts['tokenizer_sha256']}`; EOS id {facts['eos_id']} starts every text",
              "", "## Lineage", ""]
    lines += [f"- {item}" for item in facts["lineage"]] or ["- (not from a run of this lab home)"]
    lines += ["", "## Files", "",
              "- `model.safetensors`: the weights (safetensors: no pickle, no code)",
              "- `config.json`: the model's sizes (`model`, the arguments of `lab.kernel.model.GPT`), the EOS id, "
              "the run's training fields",
              "- `tokenizer.model`: the sentencepiece tokenizer",
              "- `configuration_lab_gpt.py`, `modeling_lab_gpt.py`, `tokenization_lab_gpt.py`, "
              "`generation_config.json`, `tokenizer.json`, `tokenizer_config.json`: what Hugging Face transformers "
              "loads it with (`config.json` holds its "
              "fields too)", ""]
    return "\n".join(lines + _use_lines(facts))


def _use_lines(facts: dict) -> list[str]:
    """The card's last part: the lines that load the model in transformers, `lab sample`, and the
    kit's own module."""
    out, n = facts.get("out_hint", "."), facts["model"]["context"]
    return ["## Use it", "", f"In Hugging Face transformers (`{INSTALL}`, or transformers alone; the folder "
            "carries the model's code, hence `trust_remote_code=True`):", "",
            "```python", LOAD_LINES.format(out=out), "```", "",
            "`generate()` samples as `lab sample` does (temperature 0.8, top-k 50, from `generation_config.json`); "
            "`do_sample=False` gives the likeliest tokens, those of `lab sample --temperature 0`. The tokenizer puts "
            "the EOS in front of every text, as training did (`add_special_tokens=False` leaves it out). The logits "
            f"are the kit's. Past the context ({n} tokens) the window slides as in `lab sample`: each new token "
            f"recomputes the last {n}. In the lab that trained it:", "",
            "```bash", f"lab sample {facts.get('source', facts['name'])} --prompt \"Жили-были\" --tokens 100", "```", "",
            "With the lab kit's `lab/kernel/model.py` (one file, torch only) and `safetensors`:", "",
            "```python", LOAD_BACK.format(out=out), "```", ""]


def _data_lines(data: dict | None) -> list[str]:
    if not data:
        return ["The data's manifest is not in the lab home this was exported from."]
    lines = ["| constellation | text | train tokens | licence | source |", "|---|---|---|---|---|"]
    for name, c in sorted(data["constellations"].items()):
        lines.append(f"| {name} | {_size(c.get('bytes'))} | {c.get('train_tokens', 0):,} | "
                     f"{_cell(c.get('licence'))} | {_cell(c.get('source'))} |")
    lines += ["", f"Data id `{data.get('data_id')}`, val set `{data.get('val_set')}` (whole documents held out "
                  f"by the hash of their text)."]
    return lines


def _cell(text) -> str:
    return str(text or "unknown").replace("|", "\\|").replace("\n", " ")


def _size(n: int | None) -> str:
    if not n:
        return "?"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _num(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.4f}"
