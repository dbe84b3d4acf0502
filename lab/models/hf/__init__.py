"""What an export adds so that Hugging Face transformers loads it: `AutoConfig`,
`AutoModelForCausalLM` (`trust_remote_code=True`) and `AutoTokenizer` read the export's folder.

    config.json              transformers' fields (`model_type`, `auto_map`, the sizes under
                             their usual names, the special tokens) beside the kit's own
    configuration_lab_gpt.py the config class       } shipped from this package as they are:
    modeling_lab_gpt.py      the model's code       } torch and transformers only, never `lab`
    tokenization_lab_gpt.py  the tokenizer's class  }
    generation_config.json   `generate()`'s defaults: `lab sample`'s (temperature 0.8, top-k 50,
                             200 new tokens, the EOS to stop)
    tokenizer.json           the tokenizer for `tokenizers` (`lab.models.hf.tokenizer`), which
                             encodes; the class decodes as sentencepiece does
    tokenizer_config.json    its class and special tokens

The weights need nothing more: the model's modules carry the kit's names, so model.safetensors
is read by both. Nothing here imports transformers; the kit writes the folder without it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import sentencepiece as spm

from lab.models.hf.tokenizer import pad_id, tokenizer_config, tokenizer_json
from lab.models.sampling import Settings

HERE = Path(__file__).parent
CODE = ("configuration_lab_gpt.py", "modeling_lab_gpt.py", "tokenization_lab_gpt.py")
MODEL_TYPE, ARCHITECTURE = "lab_gpt", "LabGPTForCausalLM"
FILES = ("config.json", *CODE, "generation_config.json", "tokenizer.json", "tokenizer_config.json")
INSTALL = "pip install 'lab-kit[hf]'"  # or transformers >= 4.57 alone (pyproject.toml's extra)
# The lines that load the folder in transformers and sample from it (the card, `lab export`).
LOAD_LINES = '''from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("{out}", trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained("{out}", trust_remote_code=True)
print(tok.decode(model.generate(**tok("Жили-были", return_tensors="pt"), max_new_tokens=100)[0], skip_special_tokens=True))'''


def hf_config(model: dict, eos_id: int, pad: int) -> dict:
    """transformers' part of config.json for the kit's model sizes (`GPT(**model)`)."""
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
            "auto_map": {"AutoConfig": "configuration_lab_gpt.LabGPTConfig",
                         "AutoModelForCausalLM": f"modeling_lab_gpt.{ARCHITECTURE}"},
            "vocab_size": model["vocab"], "max_position_embeddings": model["context"],
            "hidden_size": model["width"], "num_attention_heads": model["heads"],
            "num_hidden_layers": model["layers"], "bos_token_id": eos_id, "eos_token_id": eos_id,
            "pad_token_id": pad, "tie_word_embeddings": True, "use_cache": True, "dtype": "float32"}


def generation_config(eos_id: int, pad: int) -> dict:
    s = Settings()
    return {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": pad, "do_sample": True,
            "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "max_new_tokens": s.tokens}


def write_hf_files(folder: Path, config: dict, tokenizer_file: Path) -> None:
    """Writes transformers' files into `folder`; `config` is the kit's config.json, which
    transformers' fields join there."""
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_file))
    eos_id, context, pad = config["eos_id"], config["model"]["context"], pad_id(sp)
    _write_json(folder / "config.json", {**hf_config(config["model"], eos_id, pad), **config})
    _write_json(folder / "generation_config.json", generation_config(eos_id, pad))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(sp), ensure_ascii=False), encoding="utf-8")
    _write_json(folder / "tokenizer_config.json", tokenizer_config(sp, context))
    for name in CODE:
        shutil.copyfile(HERE / name, folder / name)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
