"""Export: safetensors + config + tokenizer + card, no pickle, and the card's lines load the
same model back, bitwise."""
from __future__ import annotations

import json

import pytest
import torch

from lab.models.card import LOAD_BACK
from lab.models.export import export
from lab.models.hf import FILES
from tests.conftest import lab_here

# Its module-scoped fixture is made once: every test of the file on one xdist worker.
pytestmark = pytest.mark.xdist_group("export")


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    from tests.conftest import lab_home_at
    with lab_home_at(trained.home):
        return export(trained.run.id, tmp_path_factory.mktemp("exports") / "tiny")


def test_the_export_holds_the_kits_files_and_transformers_and_no_pickle(exported):
    assert sorted(p.name for p in exported.iterdir()) == sorted(["README.md", "model.safetensors", "tokenizer.model",
                                                                 *FILES])
    for path in exported.iterdir():
        head = path.read_bytes()[:2]
        assert head != b"PK", f"{path.name} is a zip (torch.save's format)"
        if path.suffix != ".safetensors":
            assert head[0] != 0x80, f"{path.name} starts like a pickle"
    # The weights file is a safetensors file and nothing else: a length, a JSON header, then
    # exactly the raw bytes the header's tensors span.
    data = (exported / "model.safetensors").read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert header["__metadata__"]["format"] == "pt"
    assert all(v["dtype"] == "F32" for v in tensors.values())
    assert max(v["data_offsets"][1] for v in tensors.values()) == len(data) - 8 - header_len
    assert sum(v["data_offsets"][1] - v["data_offsets"][0] for v in tensors.values()) == len(data) - 8 - header_len


def test_the_cards_lines_load_it_back_with_the_same_logits_bitwise(exported, loaded, capsys):
    namespace: dict = {}
    exec(LOAD_BACK.format(out=exported), namespace)  # the card's own snippet, as a reader runs it
    model = namespace["model"]
    assert capsys.readouterr().out  # its last line wrote text
    idx = torch.randint(0, model.tok.num_embeddings, (3, loaded.model.context), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(idx), loaded.model(idx))
    assert model.num_weights() == json.loads((exported / "config.json").read_text())["weights"]


def test_the_config_and_card_say_sizes_data_licences_tokens_val_and_lineage(exported, trained, loaded):
    config = json.loads((exported / "config.json").read_text())
    assert config["model"] == {"vocab": 512, "context": 32, "width": 32, "heads": 2, "layers": 2}
    assert config["step"] == 40 and config["tokens"] == loaded.meta["tokens"] > 0
    assert config["eos_id"] == loaded.eos_id
    card = (exported / "README.md").read_text()
    for words in ["| 2 | 32 | 2 | 32 | 512 | 41,984 |", "Python Software Foundation License", "pydoc",
                  f"tokens seen: {loaded.meta['tokens']:,}", f"val loss: {config['val_loss']:.4f}",
                  f"val bits per byte: {config['val_bpb']:.4f}", trained.run.id, "from scratch", "load_file",
                  "AutoModelForCausalLM.from_pretrained(\"tiny\", trust_remote_code=True)",
                  f"lab sample {trained.run.id} --prompt"]:
        assert words in card, words
    assert (exported / "tokenizer.model").read_bytes() == (trained.data / "tokenizer.model").read_bytes()


def test_export_will_not_write_over_a_folder(exported, trained):
    code, _, err = lab_here("export", trained.run.id, "--out", str(exported))
    assert code == 2 and "exists already" in err


def test_the_card_of_a_continued_run_tells_its_lineage(trained, tmp_path):
    from lab.config import RunConfig
    from lab.kernel.checkpoint import list_checkpoints, place_checkpoint
    from lab.runs import Settled, create_run
    ckpt = list_checkpoints(trained.run.folder / "checkpoints")[-1]
    child = create_run(Settled.whole(trained.run.cfg),
                       parent={"run": trained.run.id, "checkpoint": str(ckpt), "step": 40})
    place_checkpoint(ckpt, child.folder / "checkpoints")  # as a continued run starts: the parent's checkpoint
    card = (export(child.id, tmp_path / "child") / "README.md").read_text()
    lineage = card.split("## Lineage")[1].split("##")[0]
    assert lineage.index(trained.run.id) < lineage.index(child.id)
    assert f"{child.id}: 2×32, from {trained.run.id} at step 40, to step 40" in lineage
    assert f"{trained.run.id}: 2×32, from scratch" in lineage
