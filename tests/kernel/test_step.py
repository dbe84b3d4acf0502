"""The step on its own: the precision rule, DataParallel's autocast, the out-of-memory advice (under
DDP too, in two gloo processes), the steps the GradScaler skips."""
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn as nn

from conftest import ROOT
from lab.config import RunConfig
from lab.kernel.model import GPT
from lab.kernel.fitting import largest_fitting, state_to_come_bytes
from lab.kernel.runtime import precision_warning
from lab.kernel.step import Autocast, Runtime, StepParts, make_optimizer, one_step
from lab.kernel.train import Trainer

CPU = torch.device("cpu")


class RandomBatches:
    def __init__(self, vocab: int, rows: int, context: int):
        self.vocab, self.rows, self.context = vocab, rows, context

    def take(self, step, micro):
        x = torch.randint(0, self.vocab, (self.rows, self.context + 1), generator=torch.Generator().manual_seed(step))
        return x[:, :-1], x[:, 1:]

    def prepare(self, step, micro):
        pass


def tiny_parts(precision="fp32", scaler=None) -> StepParts:
    torch.manual_seed(0)
    model = GPT(64, 16, 32, 2, 1)
    rt = Runtime(0, 1, CPU, precision, cards=1)
    return StepParts(model, model, make_optimizer(model, RunConfig(), CPU),
                     scaler or torch.amp.GradScaler("cpu", enabled=precision == "fp16"), rt)


@pytest.mark.parametrize("capability,precision,warned", [((7, 5), "bf16", True), ((7, 5), "fp16", False),
                                                        ((8, 6), "bf16", False), ((6, 0), "bf16", True)])
def test_bf16_forced_below_compute_capability_8_is_warned_with_what_it_costs(monkeypatch, capability, precision,
                                                                              warned):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    warning = precision_warning(torch.device("cuda", 0), precision)
    assert (warning is not None) == warned
    if warned:
        assert "bf16 on Tesla T4" in warning and f"{capability[0]}.{capability[1]}" in warning
        assert "emulated" in warning and "fp16 with a GradScaler" in warning
    assert precision_warning(CPU, "bf16") is None


def test_dataparallel_replicas_train_in_the_runs_dtype_whatever_their_threads_default():
    """DataParallel re-enters autocast in each replica's thread with `enabled` only, as here; the
    dtype is then the thread's default (bf16 on a CPU, fp16 on CUDA), not the run's."""
    rt = Runtime(0, 1, CPU, "fp16", cards=1)
    linear, x = nn.Linear(4, 4), torch.randn(2, 4)
    seen = {}
    with torch.autocast("cpu", dtype=torch.float16):  # the run's autocast, in the main thread
        enabled = torch.is_autocast_enabled("cpu")

        def replica(name, module):  # what parallel_apply does in each replica's thread
            with torch.autocast("cpu", enabled=enabled):
                seen[name] = module(x).dtype

        for name, module in (("bare", linear), ("wrapped", Autocast(linear, rt))):
            thread = threading.Thread(target=replica, args=(name, module))
            thread.start()
            thread.join()
    assert seen["bare"] == torch.bfloat16, "the thread's default, not the run's fp16"
    assert seen["wrapped"] == torch.float16


def test_the_optimizer_state_still_to_come_is_eight_bytes_per_weight_until_the_first_step():
    parts = tiny_parts()
    weights = parts.model.num_weights()
    assert state_to_come_bytes(parts.optimizer) == 8 * weights
    one_step(parts, RandomBatches(64, 2, 16), 0, 1e-3, clip=1.0)
    assert state_to_come_bytes(parts.optimizer) == 0
    resumed = make_optimizer(parts.model, RunConfig(), CPU)
    resumed.load_state_dict(parts.optimizer.state_dict())  # a resumed session holds its state from the start
    assert state_to_come_bytes(resumed) == 0


def test_largest_fitting_finds_the_edge_of_a_monotone_fit():
    tried = []
    assert largest_fitting(lambda b: tried.append(b) or b <= 5, 23) == 5
    assert len(tried) <= 5 and largest_fitting(lambda b: False, 7) == 0 and largest_fitting(lambda b: True, 7) == 7


def test_steps_the_grad_scaler_skips_keep_the_weights_and_are_marked_and_counted(pydoc_data, tmp_path):
    cfg = RunConfig(context=32, width=32, heads=2, layers=2, batch_per_card=4, steps_until=3, eval_every=100,
                    precision="fp16", torch_compile="off", data_dir=str(pydoc_data))
    rows = []
    trainer = Trainer(cfg, tmp_path / "run", pydoc_data, log=lambda s: None, on_metrics=rows.append)
    # A scale far too high: every gradient overflows in fp16, so the scaler skips every step.
    trainer.parts.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 100)
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.run()
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert all(r["skipped"] for r in rows if "loss" in r) and result["skipped_steps"] == 3
    assert all(torch.equal(a, b) for a, b in zip(weights, trainer.model.parameters()))


def test_a_normal_fp16_step_is_not_marked(pydoc_data, tmp_path):
    cfg = RunConfig(context=32, width=32, heads=2, layers=2, batch_per_card=4, steps_until=3, eval_every=100,
                    precision="fp16", torch_compile="off", data_dir=str(pydoc_data))
    rows = []
    result = Trainer(cfg, tmp_path / "run", pydoc_data, log=lambda s: None, on_metrics=rows.append).run()
    assert result["skipped_steps"] == 0 and not any("skipped" in r for r in rows)


DDP_OOM = '''
import json, sys
import torch
from lab.config import RunConfig
from lab.kernel import model
from lab.kernel.train import OutOfMemory, Trainer

block_forward = model.Block.forward

def small_card(self, x, cache=None):  # a card that holds 3 rows: more run out of memory mid-backward
    if x.requires_grad and x.size(0) > 3:
        def oom(grad):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        x.register_hook(oom)  # reached after this block's weights got their gradients (DDP marked them ready)
    return block_forward(self, x, cache)

model.Block.forward = small_card
cfg = RunConfig(context=32, width=32, heads=2, layers=2, batch_per_card=8, steps_until=5, eval_every=100,
                precision="fp32", torch_compile="off")
trainer = Trainer(cfg, sys.argv[2], sys.argv[1], log=lambda s: None)
try:
    trainer.run()
    said = {"error": "no out-of-memory"}
except OutOfMemory as e:
    said = {"advice": str(e)}
except Exception as e:
    said = {"error": f"{type(e).__name__}: {e}"[:300]}
# One file a rank: two ranks printing to one pipe interleave their lines.
with open(f"{sys.argv[3]}/said-{trainer.rt.rank}.json", "w") as f:
    json.dump({"rank": trainer.rt.rank, **said}, f)
'''


def test_an_out_of_memory_mid_backward_under_ddp_still_gets_its_advice(pydoc_data, tmp_path):
    """DDP's reducer still waits for its hooks after a backward that failed: a trial that fired
    them would end in 'Expected to mark a variable ready only once' instead of the advice."""
    script = tmp_path / "ddp_oom.py"
    script.write_text(DDP_OOM)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(pydoc_data), str(tmp_path / "run"), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    said = {d["rank"]: d for d in (json.loads(f.read_text()) for f in tmp_path.glob("said-*.json"))}
    assert sorted(said) == [0, 1], proc.stdout + proc.stderr
    for rank in (0, 1):
        assert "advice" in said[rank], said[rank]
        assert "batch_per_card 3 fits" in said[rank]["advice"] and "grad_accum 3" in said[rank]["advice"]
