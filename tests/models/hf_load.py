"""Loads exports the way a transformers user does, in a process that cannot import the lab kit,
and writes what it saw: `python hf_load.py SPEC.json RESULT.json` (tests/models/test_hf_export.py).

SPEC: {"folders": {name: {"folder": export, "kit": file, "batch": bool}}, "texts": [...],
"prompts": [...], "new_tokens": N, ...}; each kit file holds token ids `idx` and the kit's logits
for them. "batch": also generate for the prompts in one batch.
RESULT, per folder: the classes, the largest logit difference (also when the ids come in two
chunks through the cache), each text's ids with and without
the special tokens and the decoded ids, the decoded "odd_ids", and the greedy new tokens of each
prompt with the largest difference of their steps' logits from the kit's ("steps0", ...), alone
and in one left-padded batch; and what the card's transformers lines ("card_lines") print.
"""
import contextlib
import importlib.abc
import io
import json
import os
import sys


class NoLab(importlib.abc.MetaPathFinder):
    """The lab kit is installed (editable) in the test's environment: refuse it, so a folder
    that needed it would fail here."""

    def find_spec(self, name, path=None, target=None):
        if name == "lab" or name.startswith("lab."):
            raise ImportError(f"{name}: an export must load without the lab kit")
        return None


sys.meta_path.insert(0, NoLab())

import torch  # noqa: E402 - after the guard: nothing below may reach `lab`
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402

# transformers 5.24 calls the cache `cache`, earlier releases `past_key_values`.
CACHE = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


def new_tokens(row: list[int], start: int, eos: int) -> list[int]:
    new = row[start:]
    return new[:new.index(eos)] if eos in new else new


def check(folder: str, kit_file: str, batch: bool, spec: dict) -> dict:
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    kit = load_file(kit_file)
    with torch.no_grad():
        logits = model(kit["idx"]).logits
        head = model(kit["idx"][:, :20])  # then the rest at once, after the cached 20
        tail = model(kit["idx"][:, 20:], past_key_values=head.past_key_values if CACHE == "past_key_values"
                     else head.cache).logits
    out = {"classes": [type(config).__name__, type(model).__name__, type(tok).__name__], "fast": tok.is_fast,
           "dtype": str(logits.dtype), "max_logit_diff": (logits - kit["logits"]).abs().max().item(),
           "chunked_logit_diff": (tail - kit["logits"][:, 20:]).abs().max().item(),
           "texts": [{"ids": tok(t, add_special_tokens=False).input_ids, "with_eos": tok(t).input_ids}
                     for t in spec["texts"]], "greedy": [], "batch": []}
    for ids in out["texts"]:
        ids["decoded"] = tok.decode(ids["ids"])
    out["odd_decoded"] = [tok.decode(ids, skip_special_tokens=True) for ids in spec["odd_ids"]]
    eos, n = tok.eos_token_id, spec["new_tokens"]
    out["step_logit_diff"] = []
    for k, prompt in enumerate(spec["prompts"]):
        inputs = tok(prompt, return_tensors="pt")
        gen = model.generate(**inputs, max_new_tokens=n, do_sample=False, return_dict_in_generate=True,
                             output_logits=True)
        out["greedy"].append(new_tokens(gen.sequences[0].tolist(), inputs.input_ids.size(1), eos))
        want = kit[f"steps{k}"]
        got = torch.cat(gen.logits)[:len(want)]
        out["step_logit_diff"].append(float("inf") if got.shape != want.shape else
                                      (got - want).abs().max().item() if want.numel() else 0.0)
    if batch:
        batch = tok(spec["prompts"], return_tensors="pt", padding=True)  # left-padded with <s>
        rows = model.generate(**batch, max_new_tokens=n, do_sample=False).tolist()
        out["batch"] = [new_tokens(row, batch.input_ids.size(1), eos) for row in rows]
    return out


def card_text(lines: str, folder: str) -> str:
    """What the card's transformers lines print, run where the card says: beside the folder."""
    os.chdir(os.path.dirname(folder))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(lines, {})
    return printed.getvalue().rstrip("\n")


def main(spec_file: str, result_file: str) -> None:
    spec = json.load(open(spec_file, encoding="utf-8"))
    result = {name: check(f["folder"], f["kit"], f.get("batch", False), spec) for name, f in spec["folders"].items()}
    result["card_text"] = card_text(spec["card_lines"], next(iter(spec["folders"].values()))["folder"])
    result["lab_imported"] = any(m == "lab" or m.startswith("lab.") for m in sys.modules)
    json.dump(result, open(result_file, "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
