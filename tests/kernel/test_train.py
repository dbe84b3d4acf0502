"""`lab train` end to end, as a person runs it: real data, real processes where they matter (DDP);
config and data errors in this process. Signals and resuming: test_resume.py."""
import json
import os
import shutil
import time

import pytest
import torch

from conftest import FP32, TINY, lab, lab_here
from lab.kernel.cpu import cpu_precision
from lab.kernel.step import pick_precision

# Its module-scoped fixture is made once: every test of the file on one xdist worker.
pytestmark = pytest.mark.xdist_group("trained-run")


def train_here(*args: str) -> str:
    code, out, err = lab_here("train", *args)
    assert code == 0, out + err
    return out


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir):
    return {m["step"]: m["loss"] for m in metrics(run_dir) if "loss" in m}


@pytest.fixture(scope="module")
def trained(pydoc_data, tmp_path_factory):
    """A finished 20-step run with a checkpoint every logged step (so the newest two are kept, and the
    quarters of its stable phase: steps 4, 8, 12 and 16, where its decay began)."""
    out = tmp_path_factory.mktemp("runs") / "base"
    code, stdout, err = lab_here("train", "-c", "pydoc", *TINY, "--steps-until", "20", "--checkpoint-every-min",
                                 "0.0001", "--out", str(out))
    assert code == 0, err
    return out, stdout


def test_train_on_pydoc_logs_weights_metrics_and_a_falling_loss(trained):
    out, stdout = trained
    assert "weights 41,984" in stdout  # 12·2·32² + 512·32 + 32·32
    rows = metrics(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 21))
    for key in ("step", "tokens", "loss", "lr", "tok_s", "elapsed_s"):
        assert key in rows[0]
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20] and all(r["val_set"] for r in evals)
    assert rows[-1]["tokens"] == 20 * 4 * 32
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert (out / "checkpoints" / "ckpt_00000020.pt").is_file()
    assert json.loads((out / "config.json").read_text())["steps_until"] == 20
    # The calculator's word on it before it ran, on this computer's card (lab.sizing.calibration).
    assert json.loads((out / "predicted.json").read_text())["predictions"]["cpu"]["tok_s"] > 0
    # What it ran with and beside what, for the calculator: its threads, and other work's share of the cores.
    assert json.loads((out / "device.json").read_text())["threads"] == torch.get_num_threads()
    assert all(0.0 <= r["others_cpu"] <= 1.0 for r in rows if "others_cpu" in r)  # windows under 0.2 s have none


def test_other_works_share_of_the_cores_leaves_the_runs_own_cpu_seconds_out():
    from lab.kernel.cpu import OthersLoad
    load = OthersLoad()
    wall0, own0 = time.monotonic(), time.process_time()
    while time.process_time() - own0 < 0.4:  # this process busy on one core
        pass
    share = load.since_last()
    if share is None:
        pytest.skip("no /proc/stat here")
    wall, own = time.monotonic() - wall0, time.process_time() - own0
    assert 0.0 <= share <= 1.0
    # Its own CPU seconds are not counted as other work (10 ms jiffies: a few percent either way).
    assert share <= 1.0 - own / (wall * (os.cpu_count() or 1)) + 0.05


def test_a_trained_checkpoint_loads_with_weights_only(trained):
    state = torch.load(trained[0] / "checkpoints" / "ckpt_00000020.pt", weights_only=True)
    assert state["step"] == 20 and state["format"] == 2 and isinstance(state["rng"][0]["torch"], torch.Tensor)


def test_ddp_in_two_gloo_processes_matches_one_process_with_the_doubled_batch(pydoc_data, tmp_path):
    flags = [*TINY, *FP32]
    flags[flags.index("--batch-per-card") + 1] = "3"
    ddp = lab("train", "-c", "pydoc", *flags, "--steps-until", "6", "--nproc", "2", "--out", str(tmp_path / "ddp"))
    flags[flags.index("--batch-per-card") + 1] = "6"
    train_here("-c", "pydoc", *flags, "--steps-until", "6", "--out", str(tmp_path / "one"))
    assert "cpu x2" in ddp.stdout
    two, one = losses(tmp_path / "ddp"), losses(tmp_path / "one")
    assert sorted(two) == sorted(one) == list(range(1, 7))
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-5)
    assert metrics(tmp_path / "ddp")[-1]["tokens"] == metrics(tmp_path / "one")[-1]["tokens"]


def test_a_json_config_file_gives_the_same_run_as_flags(pydoc_data, tmp_path):
    cfg = {"constellations": ["pydoc"], "context": 32, "width": 32, "heads": 2, "layers": 2, "batch_per_card": 4,
           "eval_every": 10, "eval_batches": 2, "lr": 3e-3, "warmup_steps": 2, "steps_until": 3}
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    train_here("--config", str(tmp_path / "run.json"), "--out", str(tmp_path / "a"))
    train_here("-c", "pydoc", *TINY, "--steps-until", "3", "--out", str(tmp_path / "b"))
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_a_links_spec_trains_here_with_the_sessions_own_limit_not_the_runs_wish(pydoc_data, tmp_path):
    run = {"constellations": ["pydoc"], "context": 32, "width": 32, "heads": 2, "layers": 2, "batch_per_card": 4,
           "eval_every": 10_000, "eval_batches": 1, "warmup_steps": 2, "steps_until": 100_000, "limit_min": 630}
    spec = {"run": run, "session": {"limit_min": 0.05, "data_dir": str(pydoc_data), "out_dir": str(tmp_path / "a")}}
    (tmp_path / "spec.json").write_text(json.dumps(spec, ensure_ascii=False))
    code, out, err = lab_here("train", "--spec", str(tmp_path / "spec.json"))
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["reason"] == "time limit" and 0 < result["step"] < 100_000  # 3 s, not 630 minutes
    assert json.loads((tmp_path / "a" / "config.json").read_text())["limit_min"] == 630  # the run's wish, kept
    err = _fails("train", "--spec", str(tmp_path / "spec.json"), "--layers", "3")
    assert "--spec holds the run's fields" in err and "layers" in err


# --- bad input: a clear error, exit status 2, nothing overwritten ---------------------------

def _fails(*args):
    code, out, err = lab_here(*args)
    assert code == 2, out + err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_bad_input_as_a_person_types_it_exits_2_with_one_line(pydoc_data, tmp_path):
    proc = lab("train", "-c", "pydoc", *TINY, "--width", "30", "--heads", "4", "--out", str(tmp_path / "x"),
               check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "lab train: error: width 30 does not divide by heads 4: pick heads among " \
                                  "[1, 2, 3, 5, 6, 10, 15, 30]"


def test_width_not_divisible_by_heads(pydoc_data, tmp_path):
    err = _fails("train", "-c", "pydoc", *TINY, "--width", "30", "--heads", "4", "--out", str(tmp_path / "x"))
    assert "width 30 does not divide by heads 4" in err
    assert not (tmp_path / "x").exists()


def test_context_longer_than_the_shortest_split(pydoc_data, tmp_path):
    err = _fails("train", "-c", "pydoc", *TINY, "--context", "10000000", "--out", str(tmp_path / "x"))
    assert "longer than the data's shortest split" in err


@pytest.mark.parametrize("flag", ["--batch-per-card", "--steps-until"])
def test_batch_or_steps_below_one(pydoc_data, tmp_path, flag):
    err = _fails("train", "-c", "pydoc", *TINY, flag, "0", "--out", str(tmp_path / "x"))
    assert f"{flag[2:].replace('-', '_')} must be at least 1" in err


def test_steps_until_not_above_the_checkpoints_step(trained, tmp_path):
    out, _ = trained
    err = _fails("train", "-c", "pydoc", *TINY, "--resume", str(out), "--steps-until", "20", "--out", str(tmp_path / "x"))
    assert "steps_until 20 is not above the checkpoint's step 20" in err


def test_resuming_with_another_architecture_names_the_field(trained, tmp_path):
    out, _ = trained
    err = _fails("train", "-c", "pydoc", *TINY, "--width", "64", "--resume", str(out), "--steps-until", "30",
                 "--out", str(tmp_path / "x"))
    assert "width is locked when continuing: the checkpoint has width=32" in err


def test_model_fields_come_from_the_checkpoint_when_not_given(trained, tmp_path):
    out, _ = trained
    code, stdout, err = lab_here("train", "-c", "pydoc", "--resume", str(out), "--steps-until", "22",
                                 "--eval-every", "10", "--eval-batches", "2", "--out", str(tmp_path / "cont"))
    assert code == 0, err
    assert "weights 41,984" in stdout
    rows = metrics(tmp_path / "cont")
    # The new folder starts with the earlier session's rows, so the curve reads as one line.
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 23))
    assert {r["session"] for r in rows if r["step"] > 20} == {2}


def test_a_corrupt_checkpoint_is_refused_and_the_previous_used_only_when_asked(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained[0], run)
    *stable, previous, newest = sorted((run / "checkpoints").glob("ckpt_*.pt"))  # and its stable phase's quarters
    assert [p.name for p in stable] == [f"ckpt_{s:08d}.pt" for s in (4, 8, 12, 16)] and newest.name == "ckpt_00000020.pt"
    # Without the stable phase's checkpoints, more steps go on from the newest (re-warmed: lab.settle.grow);
    # with one, the run would grow from there and never read the newest.
    for ckpt in stable:
        ckpt.unlink()
        ckpt.with_suffix(".json").unlink()
    newest.write_bytes(newest.read_bytes()[:1000])
    before = (run / "metrics.jsonl").read_text()
    err = _fails("train", "-c", "pydoc", *TINY, "--resume", str(run), "--steps-until", "25", "--out", str(run))
    assert "ckpt_00000020.pt is unusable: it is truncated" in err and "--allow-fallback" in err
    assert (run / "metrics.jsonl").read_text() == before
    code, stdout, err = lab_here("train", "-c", "pydoc", *TINY, "--resume", str(run), "--steps-until", "25",
                                 "--allow-fallback", "--out", str(run))
    assert code == 0, err
    assert "resuming from" in stdout and previous.name in stdout


def test_missing_shards(pydoc_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(pydoc_data, data)
    next(data.glob("*/train_*.bin")).unlink()
    err = _fails("train", "--data-dir", str(data), *TINY, "--out", str(tmp_path / "x"))
    assert "missing shard" in err


def test_unknown_constellation(pydoc_data, tmp_path):
    err = _fails("train", "-c", "no-such-thing", *TINY, "--out", str(tmp_path / "x"))
    assert "no-such-thing" in err and "pydoc" in err


def test_an_out_folder_holding_a_run_is_not_overwritten(trained):
    out, _ = trained
    before = (out / "metrics.jsonl").read_text()
    err = _fails("train", "-c", "pydoc", *TINY, "--out", str(out))
    assert "already holds a run" in err
    assert (out / "metrics.jsonl").read_text() == before


# --- precision --------------------------------------------------------------------------

@pytest.mark.parametrize("capability,expected", [((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")])
def test_precision_follows_compute_capability_not_is_bf16_supported(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what a T4 says
    assert pick_precision(torch.device("cuda", 0)) == expected


@pytest.mark.parametrize("flags,expected", [("fpu avx2 avx512f avx512_bf16 avx512_vnni", "bf16"),
                                            ("fpu avx2 amx_bf16 amx_tile", "bf16"),
                                            ("fpu avx2 avx512f avx512_vnni", "fp32")])
def test_a_cpu_trains_in_bf16_only_where_it_multiplies_bf16_itself(tmp_path, flags, expected):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert cpu_precision(str(info)) == expected
    assert cpu_precision(str(tmp_path / "none")) == "fp32", "no flags to read: no claim of bf16"
    assert pick_precision(torch.device("cpu")) == cpu_precision()


def test_bf16_autocast_trains_on_any_cpu(pydoc_data, tmp_path):
    """What auto picks on a CPU with bf16 instructions, forced here (slower where emulated)."""
    train_here("-c", "pydoc", *TINY, "--precision", "bf16", "--steps-until", "12", "--out", str(tmp_path / "bf16"))
    rows = metrics(tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "device.json").read_text())["precision"] == "bf16"
    logged = [r["loss"] for r in rows if "loss" in r]
    assert len(logged) == 12 and logged[-1] < logged[0] - 0.5
    assert all(0 < r["val_loss"] < 10 for r in rows if "val_loss" in r)


# --- out of memory ----------------------------------------------------------------------------

def test_cuda_out_of_memory_says_to_lower_the_batch_and_which_batch_fits(pydoc_data, tmp_path, monkeypatch):
    from lab.config import RunConfig
    from lab.kernel.model import GPT
    from lab.kernel.fitting import OutOfMemory
    from lab.kernel.train import Trainer

    real_forward = GPT.forward

    def small_card(self, idx, targets=None):  # a card that holds at most 3 rows
        if idx.size(0) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(self, idx, targets)

    monkeypatch.setattr(GPT, "forward", small_card)
    cfg = RunConfig(context=32, width=32, heads=2, layers=2, batch_per_card=8, steps_until=5, eval_every=100)
    trainer = Trainer(cfg, tmp_path / "oom", pydoc_data, log=lambda s: None)
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(OutOfMemory) as err:
        trainer.run()
    message = str(err.value)
    assert "CUDA out of memory at batch_per_card 8" in message and "lower the batch per card" in message
    assert "batch_per_card 3 fits" in message and "grad_accum 3" in message
    assert all(torch.equal(a, b) for a, b in zip(weights, trainer.model.parameters())), "trials leave weights alone"


def test_gradient_accumulation_matches_the_bigger_batch(pydoc_data, tmp_path):
    flags = [*TINY, *FP32]
    flags[flags.index("--batch-per-card") + 1] = "2"
    train_here("-c", "pydoc", *flags, "--grad-accum", "2", "--steps-until", "5", "--out", str(tmp_path / "accum"))
    train_here("-c", "pydoc", *TINY, *FP32, "--steps-until", "5", "--out", str(tmp_path / "big"))
    accum, big = losses(tmp_path / "accum"), losses(tmp_path / "big")
    assert sorted(accum) == list(range(1, 6))
    assert all(accum[s] == pytest.approx(big[s], abs=1e-5) for s in big)


def test_resuming_on_more_constellations_is_allowed_and_starts_a_new_val_set(trained, lab_home, tmp_path):
    from lab import corpus
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(30):
        (texts / f"{i}.txt").write_text(f"Document {i}: the lab trains small models on Kaggle. " * 40)
    corpus.add_constellation("notes", [str(texts)])
    corpus.prepare(["pydoc", "notes"], vocab=512, progress=False)  # reuses the pydoc tokenizer
    out = tmp_path / "more"
    train_here("-c", "pydoc", "-c", "notes", "--resume", str(trained[0]), "--steps-until", "30",
               "--eval-every", "10", "--eval-batches", "2", "--out", str(out))
    vals = [(r["step"], r["val_set"]) for r in metrics(out) if "val_loss" in r]
    assert [s for s, _ in vals] == [10, 20, 30]
    # It grows from step 16, where the old run's decay began (lab.settle.grow): step 10's evaluation
    # is the old run's, on its val set; 20 and 30 are the grown run's, on the new data's.
    assert vals[0][1] != vals[1][1] == vals[2][1]
