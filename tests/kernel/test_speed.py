"""The fast path: compile with an uncompiled fallback, losses read every few steps, batches
prepared ahead; and the speed scripts run."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import FP32, ROOT, TINY, lab
from lab.config import RunConfig
from lab.kernel.data import Prefetcher, TokenData
from lab.kernel.speed import (COMPILE_MIN_FLOPS_CPU, Readings, compile_choice, compile_or_eager, cxx_compiler,
                              next_sync_steps)
from lab.kernel.train import Trainer


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tiny_config(data, steps):
    return RunConfig(constellations=["pydoc"], context=32, width=32, heads=2, layers=2, batch_per_card=4,
                     eval_every=10, eval_batches=2, lr=3e-3, warmup_steps=2, steps_until=steps, data_dir=str(data),
                     torch_compile="off")


def test_metrics_hold_every_logged_step_with_their_own_loss_and_grad_norm(pydoc_data, tmp_path):
    lab("train", "-c", "pydoc", *TINY, "--steps-until", "30", "--out", str(tmp_path / "every"))
    lab("train", "-c", "pydoc", *TINY, "--steps-until", "30", "--log-every", "4", "--out", str(tmp_path / "fourth"))
    every = [r for r in rows(tmp_path / "every") if "loss" in r]
    fourth = [r for r in rows(tmp_path / "fourth") if "loss" in r]
    assert [r["step"] for r in every] == list(range(1, 31))
    assert [r["step"] for r in fourth] == list(range(4, 31, 4))
    assert all(r["grad_norm"] > 0 and r["tok_s"] > 0 for r in every)
    assert len({r["loss"] for r in every}) == 30  # each step its own loss, not a window's last one
    by_step = {r["step"]: r for r in every}
    for r in fourth:  # the same run logged less often: the same values at the same steps
        assert r["loss"] == by_step[r["step"]]["loss"] and r["grad_norm"] == by_step[r["step"]]["grad_norm"]
    evals = [r["step"] for r in rows(tmp_path / "every") if "val_loss" in r]
    assert evals == [10, 20, 30]


def test_losses_read_every_few_steps_equal_losses_read_every_step(pydoc_data, tmp_path):
    logged = []
    Trainer(tiny_config(pydoc_data, 25), tmp_path / "loop", pydoc_data, log=lambda _: None,
            on_metrics=logged.append).run()
    stepper = Trainer(tiny_config(pydoc_data, 25), tmp_path / "steps", pydoc_data, log=lambda _: None)
    synced = [stepper.train_step()[0].item() for _ in range(25)]  # a host sync after every step
    assert [r["loss"] for r in logged if "loss" in r] == synced  # bitwise


def test_a_failing_compiler_leaves_the_run_uncompiled_with_a_log_line(pydoc_data, tmp_path):
    proc = lab("train", "-c", "pydoc", *TINY, "--steps-until", "3", "--torch-compile", "on",
               "--out", str(tmp_path / "run"), env={"CXX": str(tmp_path / "no-such-compiler")})
    assert "torch.compile failed" in proc.stdout and "training uncompiled" in proc.stdout
    assert [r["step"] for r in rows(tmp_path / "run") if "loss" in r] == [1, 2, 3]


def test_an_exception_while_compiling_gives_back_the_module_itself():
    said = []
    module = torch.nn.Linear(2, 2)

    def broken(_):
        raise RuntimeError("backend exploded\nsecond line")

    got, seconds = compile_or_eager(module, trial=lambda m: m(torch.zeros(1, 2)), log=said.append, compiler=broken)
    assert got is module and seconds is None
    assert said == ["torch.compile failed (RuntimeError: backend exploded); training uncompiled. "
                    "Set torch_compile off to skip the attempt."]


def test_a_compiler_failing_on_another_rank_leaves_every_rank_uncompiled():
    module = torch.nn.Linear(2, 2)
    got, _ = compile_or_eager(module, trial=lambda m: None, log=lambda _: None, agree_ok=lambda ok: False,
                              compiler=lambda m: torch.nn.Identity())
    assert got is module


@pytest.mark.skipif(cxx_compiler() is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_training_gives_the_uncompiled_losses_up_to_float_noise(pydoc_data, tmp_path):
    compiled = lab("train", "-c", "pydoc", *TINY, *FP32, "--steps-until", "8", "--torch-compile", "on",
                   "--out", str(tmp_path / "compiled"))
    lab("train", "-c", "pydoc", *TINY, *FP32, "--steps-until", "8", "--torch-compile", "off",
        "--out", str(tmp_path / "eager"))
    assert "compiled the model in" in compiled.stdout
    a = [r["loss"] for r in rows(tmp_path / "compiled") if "loss" in r]
    b = [r["loss"] for r in rows(tmp_path / "eager") if "loss" in r]
    assert len(a) == len(b) == 8 and a == pytest.approx(b, abs=1e-4)
    val = [[r["val_loss"] for r in rows(tmp_path / run) if "val_loss" in r] for run in ("compiled", "eager")]
    assert len(val[0]) == 1 and val[0] == pytest.approx(val[1], abs=1e-4)  # the evaluation runs compiled too


def test_auto_compiles_on_a_gpu_and_on_cpu_only_for_long_runs_with_a_compiler(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert compile_choice("auto", cuda, 1.0)[0]
    assert not compile_choice("off", cuda, 1e20)[0]
    assert compile_choice("on", cpu, 1.0)[0]
    monkeypatch.setenv("CXX", "/no/such/g++")
    wanted, why = compile_choice("auto", cpu, 1e20)
    assert not wanted and "no C++ compiler (/no/such/g++)" in why
    monkeypatch.setenv("CXX", sys.executable)  # any file that exists stands for a compiler here
    assert compile_choice("auto", cpu, COMPILE_MIN_FLOPS_CPU)[0]
    wanted, why = compile_choice("auto", cpu, COMPILE_MIN_FLOPS_CPU / 2)
    assert not wanted and "too short" in why


def test_sync_points_come_about_once_a_second():
    assert next_sync_steps(0.0) == 1
    assert next_sync_steps(2.0) == 1
    assert next_sync_steps(0.1) == 10
    assert next_sync_steps(1e-6) == 64


def test_readings_keep_each_steps_values_and_sum_across_ranks():
    r = Readings()
    for i in range(3):
        r.add({"step": i + 1}, torch.tensor(float(i)), torch.tensor(10.0 + i))
    doubled, extra = r.take(torch.device("cpu"), [1.0, 0.0], reduce=lambda t: t.mul_(2))  # two equal ranks
    assert [(d["step"], d["loss"], d["grad_norm"]) for d in doubled] == [(1, 0.0, 10.0), (2, 2.0, 11.0), (3, 4.0, 12.0)]
    assert extra == [2.0, 0.0] and len(r) == 0
    assert r.take(torch.device("cpu"), [0.0], reduce=lambda t: None) == ([], [0.0])


def test_the_prepared_batch_is_the_batch_that_would_be_read(pydoc_data):
    data = TokenData(pydoc_data)
    reads = []

    def read(step, micro):
        reads.append((step, micro))
        return data.train_batch(seed=1, step=step, micro=micro, accum=2, rank=0, world=1, rows=3, context=16)

    batches = Prefetcher(read, torch.device("cpu"))
    batches.prepare(5, 1)
    x, y = batches.take(5, 1)
    assert reads == [(5, 1)]
    assert torch.equal(x, read(5, 1)[0]) and torch.equal(y, read(5, 1)[1])
    batches.prepare(6, 0)
    batches.take(7, 0)  # not what was prepared: read on the spot
    assert reads[-1] == (7, 0)


def test_a_prepared_batch_is_contiguous_before_it_is_pinned(pydoc_data):
    """A batch is a view into one array (inputs and targets overlap); pinning a view keeps its
    strides, and the copy to the card then goes through an unpinned temporary."""
    data = TokenData(pydoc_data)
    x, y = data.train_batch(seed=1, step=0, micro=0, accum=1, rank=0, world=1, rows=3, context=16)
    assert not x.is_contiguous()  # what the memmap gives
    batches = Prefetcher(lambda step, micro: (x, y), torch.device("cpu"))
    batches.prepare(0, 0)
    got_x, got_y = batches.take(0, 0)
    assert got_x.is_contiguous() and got_y.is_contiguous() and torch.equal(got_x, x) and torch.equal(got_y, y)


def gpu_check_smoke(*jobs: str) -> dict:
    """gpu-check's reduced mode on the CPU, only `jobs`: its report's runs, each without an error."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check"), "--cpu-smoke", "--steps", "4",
                           "--only", ",".join(jobs)], capture_output=True, text=True, cwd=ROOT, env={**os.environ},
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    runs = report["runs"]
    assert report["smoke"] and list(runs) == list(jobs)
    for name, run in runs.items():
        assert "error" not in run and "skipped" not in run, (name, run)
    return runs


# gpu-check's jobs in three tests, so that the suite's processes share them: every job of a GPU
# machine at a tiny size on the CPU.

def test_gpu_check_benches_ddp_in_gloo_and_the_cards_own_path_on_cpu(pydoc_data):
    runs = gpu_check_smoke("ddp", "native")
    for name in ("ddp", "native"):
        assert runs[name]["real_tok_s"]["median"] > 0 and runs[name]["lean_tok_s"]["median"] > 0
        assert runs[name]["real_over_lean"] > 0 and 0 < runs[name]["eval"]["share_of_session"] < 1
        assert "t4_equivalent_tok_s" not in runs[name]  # no figure of another card
    assert runs["ddp"]["world"] == 2


def test_gpu_check_trains_the_t4s_path_and_answers_out_of_memory_on_a_simulated_card(pydoc_data):
    """The T4's path (fp16 with a GradScaler), the out-of-memory answers on a small simulated card,
    under DDP too."""
    runs = gpu_check_smoke("t4_path", "memory", "memory_ddp")
    t4 = runs["t4_path"]
    assert t4["precision"] == "fp16" and t4["trains"]["losses_finite"] and t4["trains"]["skipped_steps"] == 0
    for memory, cards in ((runs["memory"], ("T4", "rtx3050")), (runs["memory_ddp"], ("T4",))):
        for card in cards:
            got = memory[card]
            assert got["largest_fits"] and got["above_ran_out"] and got["advised_fits"], got
            assert got["advised"] == got["largest_batch"] == 3
    assert runs["memory_ddp"]["world"] == 2
    assert set(runs["memory"]["estimate_vs_peak"]) == {"6", "24"}


def test_gpu_check_resumes_a_sigterm_run_on_the_same_curve(pydoc_data):
    resume = gpu_check_smoke("resume")["resume"]
    assert resume["stopped_by_sigterm"] and resume["stopped_early"] and resume["bitwise"] and resume["same_curve"]


def test_the_train_a_b_bench_runs_both_sides_and_prints_json(lab_home, tmp_path):
    """Against its own commit: both sides are the same code, so their losses are the same."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_train_ab.py"), "--before", "HEAD",
                           "--size", "tiny", "--rounds", "1", "--warmup", "5", "--home", str(tmp_path / "home")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    before, after = report["before"][0], report["after"][0]
    assert before["tok_s"] > 0 and after["tok_s"] > 0 and report["after_over_before"] > 0
    assert before["val_loss"] == after["val_loss"] and before["precision"] == after["precision"]
