"""The export in Hugging Face transformers: a fresh process that cannot import the kit loads the
folder with AutoConfig, AutoModelForCausalLM and AutoTokenizer (tests/models/hf_load.py) and gets
the kit's logits, token ids and greedy tokens, for a one-process run, a two-process (DDP, gloo) run
and a run continued from that one. One process checks all three: importing transformers takes
seconds. The export itself needs no transformers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lab.models.export import export
from lab.models.hf import FILES
from lab.models.loading import load_model
from lab.models.sampling import Settings, prompt_ids, sample, token_ids
from tests.conftest import FP32, TINY, lab_here, lab_home_at

pytestmark = pytest.mark.xdist_group("hf-export")

HERE = Path(__file__).parent
TEXTS = ["Жили-были старик со старухой", "ёлка, Ёж и ещё", "«Война и мир»", "tab\there\t", "CRLF\r\nline\r\n",
         "emoji 😀👍🏽🇷🇺", "trailing spaces   ", "   leading spaces", "", "  \n\n  ", "</s> and <s> are text here",
         "def f(x):\n    return x  # 1234"]
LONG = "The for statement is used to iterate over the elements of a sequence (such as a string, tuple or list)"
PROMPTS = ["The for statement", "", LONG]  # LONG has more tokens than the context
NEW = 45  # new tokens: past the context 32, into the window that slides
# Ids no encoding gives, as a model may write them: byte runs that make no character between
# valid ones (Ж is D0 96, a lone D0 makes none), and the EOS; decoded they follow sentencepiece.
ODD_IDS = [[3 + 0xD0, 3 + 0x96, 3 + 0xD0, 3 + 0x41, 3 + 0xF0, 3 + 0x9F], [3 + 0x80, 2, 3 + 0xD0, 3 + 0x96, 3 + 0xFF]]


@pytest.fixture(scope="module")
def exports(trained, tmp_path_factory) -> dict[str, tuple]:
    """{name: (what was exported, its export folder)}: the session's run, a DDP run, and that
    DDP run continued in one process."""
    root = tmp_path_factory.mktemp("hf")
    with lab_home_at(trained.home):
        data = ["--data-dir", str(trained.data)]  # the session's, whatever other tests prepare beside it
        for args in ([*data, *TINY, *FP32, "--steps-until", "4", "--nproc", "2", "--out", str(root / "ddp")],
                     [*data, "--resume", str(root / "ddp"), "--steps-until", "6", "--out", str(root / "continued")]):
            code, out, err = lab_here("train", *args)
            assert code == 0 and ("cpu x2" in out or "--resume" in args), out + err  # two processes indeed
        targets = {"one process": trained.run.id, "DDP": root / "ddp", "continued": root / "continued"}
        return {name: (t, export(t, root / f"export-{i}")) for i, (name, t) in enumerate(targets.items())}


@pytest.fixture(scope="module")
def kit(exports, trained, tmp_path_factory) -> dict[str, dict]:
    """The kit's own numbers for each export: logits, token ids, greedy tokens (`lab sample
    --temperature 0`) and the logits of each of their steps, saved for the other process."""
    root, out = tmp_path_factory.mktemp("kit"), {}
    with lab_home_at(trained.home):
        for name, (target, _) in exports.items():
            loaded, file = load_model(target, device="cpu"), root / f"{len(out)}.safetensors"
            greedy = [list(token_ids(loaded, p, Settings(tokens=NEW, temperature=0))) for p in PROMPTS]
            save_file(kit_logits(loaded, greedy), file)
            out[name] = {"file": str(file), "eos": loaded.eos_id, "ids": [loaded.tokenizer.encode(t) for t in TEXTS],
                         "prompt_ids": [len(loaded.tokenizer.encode(p)) + 1 for p in PROMPTS], "greedy": greedy,
                         "decoded": [loaded.tokenizer.decode(ids) for ids in ODD_IDS]}
    return out


def kit_logits(loaded, greedy: list[list[int]]) -> dict[str, torch.Tensor]:
    """Random token ids and their logits; for each prompt, the logits before each greedy token,
    on the path without a cache (the last n tokens each time), which the kit's cache matches
    (test_sampling.py)."""
    model = loaded.model
    idx = torch.randint(0, 512, (3, model.context), generator=torch.Generator().manual_seed(0))
    out = {"idx": idx}
    with torch.no_grad():
        out["logits"] = model(idx)
        for k, (prompt, new) in enumerate(zip(PROMPTS, greedy)):
            seq = torch.tensor([prompt_ids(loaded, prompt) + new])
            start = seq.size(1) - len(new)
            steps = [model(seq[:, :start + j][:, -model.context:])[:, -1] for j in range(len(new))]
            out[f"steps{k}"] = torch.cat(steps) if steps else torch.zeros(0, model.tok.num_embeddings)
    return out


@pytest.fixture(scope="module")
def seen(exports, kit, tmp_path_factory) -> dict:
    """What a transformers user's process saw, in an environment of its own (no LAB_HOME, no
    PYTHONPATH, a fresh HF_HOME, offline)."""
    root = tmp_path_factory.mktemp("hf-load")
    card = (exports["one process"][1] / "README.md").read_text(encoding="utf-8")
    spec = {"folders": {name: {"folder": str(folder), "kit": kit[name]["file"], "batch": name == "one process"}
                        for name, (_, folder) in exports.items()},
            "texts": TEXTS, "prompts": PROMPTS, "new_tokens": NEW, "odd_ids": ODD_IDS, "card_lines": card_lines(card)}
    (root / "spec.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "HF_HOME": str(root / "hf"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, str(HERE / "hf_load.py"), str(root / "spec.json"), str(root / "seen.json")],
                          capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, ("transformers is installed by scripts/setup (pip install -e '.[test,hf]'):\n"
                                  + proc.stdout + proc.stderr)
    return json.loads((root / "seen.json").read_text(encoding="utf-8"))


def card_lines(card: str) -> str:
    """The card's Python block that uses transformers."""
    blocks = card.split("```python\n")[1:]
    return next(b.split("```")[0] for b in blocks if "from transformers" in b)


def test_transformers_loads_every_export_with_its_classes_and_never_the_kit(seen, exports):
    assert seen["lab_imported"] is False
    for name, (_, folder) in exports.items():
        assert seen[name]["classes"][:2] == ["LabGPTConfig", "LabGPTForCausalLM"], name
        assert seen[name]["classes"][2] == "LabGPTTokenizer" and seen[name]["fast"], name
        assert {p.name for p in folder.iterdir()} >= set(FILES)


def test_the_logits_are_the_kits_in_fp32(seen, exports):
    for name in exports:
        assert seen[name]["dtype"] == "torch.float32", name
        assert seen[name]["max_logit_diff"] <= 1e-5, name
        assert seen[name]["chunked_logit_diff"] <= 1e-5, name  # 12 tokens at once after 20 in the cache


def test_auto_tokenizer_gives_the_kits_ids_and_decodes_them_back_exactly(seen, kit, exports):
    for name in exports:
        eos = kit[name]["eos"]
        for text, want, got in zip(TEXTS, kit[name]["ids"], seen[name]["texts"]):
            assert got["ids"] == want, (name, text)
            assert got["with_eos"] == [eos] + want, (name, text)  # what `lab sample` feeds the model
            assert got["decoded"] == text, (name, text)
        assert seen[name]["odd_decoded"] == kit[name]["decoded"], name
    assert any(len(ids) > 1 and 3 <= min(ids) <= 258 for ids in kit["one process"]["ids"])  # byte pieces met
    assert kit["one process"]["decoded"][0] == "Ж\ufffdA\ufffd\ufffd"


def test_greedy_generate_gives_lab_samples_tokens_at_temperature_0_also_past_the_context(seen, kit, exports):
    for name in exports:
        want = kit[name]["greedy"]
        assert seen[name]["greedy"] == want, name
        assert max(seen[name]["step_logit_diff"]) <= 1e-5, name  # every step's logits, in the cache and past it
    one = kit["one process"]
    assert seen["one process"]["batch"] == one["greedy"]  # the three prompts in one left-padded batch
    assert one["prompt_ids"][2] > 32  # LONG starts past the context
    assert all(n + len(g) > 32 for n, g in zip(one["prompt_ids"], one["greedy"]))  # each goes past it


def test_the_cards_transformers_lines_run_and_write_text(seen):
    assert seen["card_text"].startswith("Жили-были") and len(seen["card_text"]) > len("Жили-были") + 20


def test_lab_sample_at_temperature_0_is_greedy_whatever_the_seed(trained, loaded):
    args = ["sample", trained.run.id, "--prompt", "The for", "--tokens", "30", "--temperature", "0"]
    code, a, err = lab_here(*args, "--seed", "1")
    assert code == 0, err
    assert lab_here(*args, "--seed", "2")[1] == a == f"The for{sample(loaded, 'The for', Settings(30, 0))}\n"


def test_export_writes_the_folder_without_transformers_and_says_how_to_load_it(trained, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    code, out, err = lab_here("export", trained.run.id, "--out", str(tmp_path / "x"))
    assert code == 0, err
    assert "AutoModelForCausalLM.from_pretrained" in out and "pip install 'lab-kit[hf]'" in out
    assert {p.name for p in (tmp_path / "x").iterdir()} >= set(FILES)
