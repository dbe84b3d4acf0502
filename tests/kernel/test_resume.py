"""Resuming continues the run as it was: the checkpoint's fields unless given now, bitwise on CPU."""
import json
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TINY, lab_here
from lab.config import ConfigError, RunConfig
from lab.kernel.train import Trainer
from lab.settle import preview

# A run whose fields are off the defaults, so a resume that fell back to them would show.
# Saves (and so sync points, where a signal is acted on) every ~10 ms: the stop lands mid-run.
RUN = [*TINY, "--batch-per-card", "8", "--seed", "3", "--grad-clip", "0.5", "--eval-every", "100", "-c", "pydoc",
       "--checkpoint-every-min", "0.0002"]


def _checkpoint(folder, cfg: dict, step: int = 100):
    """A checkpoint's sidecar as a save writes it (the preview reads only the sidecar)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ckpt_{step:08d}.pt").write_bytes(b"weights")
    (folder / f"ckpt_{step:08d}.json").write_text(json.dumps({"step": step, "config": cfg, "sha256": "x"}))
    return folder / f"ckpt_{step:08d}.pt"


def test_fields_not_given_come_from_the_checkpoint_and_given_ones_override(tmp_path):
    ckpt = _checkpoint(tmp_path, RunConfig(batch_per_card=8, seed=3, width=32, heads=2, lr=3e-3, steps_until=300,
                                           data_dir="/elsewhere/data", machine="alice", resume_from="x").to_dict())
    pv = preview({"steps_until": 500, "lr": 1e-3}, str(ckpt))
    cfg = pv.cfg
    assert (cfg.batch_per_card, cfg.seed, cfg.width, cfg.heads) == (8, 3, 32, 2)
    assert (cfg.steps_until, cfg.lr) == (500, 1e-3)
    assert (cfg.machine, cfg.resume_from) == ("auto", ""), "where a session runs is never carried over"
    assert cfg.data_dir != "/elsewhere/data"
    assert pv.settled.start.checkpoint == str(ckpt) and pv.settled.start.step == 100
    assert pv.settled.given == {"steps_until", "lr"}


def test_a_given_field_equal_to_its_default_still_overrides_the_checkpoint(tmp_path):
    ckpt = _checkpoint(tmp_path, RunConfig(batch_per_card=8).to_dict())
    assert preview({"batch_per_card": 6}, str(ckpt)).cfg.batch_per_card == 6
    assert preview({}, str(ckpt)).cfg.batch_per_card == 8


def test_model_fields_stay_locked(tmp_path):
    ckpt = _checkpoint(tmp_path, RunConfig(width=32, heads=2).to_dict())
    assert preview({"width": 32}, str(ckpt)).cfg.width == 32
    [locked] = preview({"width": 64}, str(ckpt)).problems
    assert locked.field == "width" and "width is locked when continuing: the checkpoint has width=32" in locked.en


def test_a_checkpoint_config_from_another_version_keeps_what_it_knows(tmp_path):
    ckpt = _checkpoint(tmp_path, {"seed": 3, "a_field_since_removed": 1})
    cfg = preview({}, str(ckpt)).cfg
    assert cfg.seed == 3 and cfg.batch_per_card == RunConfig().batch_per_card


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _stop_at_a_random_step(cmd, run, lines):
    """Starts `cmd`, sends SIGTERM once `lines` metrics lines exist, and returns its output."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= lines:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_then_a_resume_with_only_steps_until_continues_bitwise(pydoc_data, tmp_path, nproc):
    steps = 30
    procs = ["--nproc", str(nproc)] if nproc > 1 else []
    assert lab_here("train", *RUN, *procs, "--steps-until", str(steps), "--out", str(tmp_path / "ref"))[0] == 0
    run = tmp_path / "stopped"
    stop_after = random.Random().randint(3, steps // 2)
    out = _stop_at_a_random_step([sys.executable, "-m", "lab.cli", "train", *RUN, *procs, "--steps-until",
                                  str(steps), "--out", str(run)], run, stop_after)
    stopped_at = max(_losses(run))
    assert stopped_at < steps, f"the run must stop early, on the signal (after {stop_after} lines)"
    assert f"stopped at step {stopped_at} (SIGTERM received)" in out
    assert (run / "checkpoints" / f"ckpt_{stopped_at:08d}.pt").is_file()

    code, out, err = lab_here("train", "--resume", str(run), *procs, "--steps-until", str(steps), "--out", str(run))
    assert code == 0, out + err
    assert json.loads((run / "config.json").read_text())["batch_per_card"] == 8
    resumed, ref = _losses(run), _losses(tmp_path / "ref")
    assert sorted(resumed) == list(range(1, steps + 1))
    assert resumed == ref, f"stopped at {stopped_at}: the floats compare equal at every step"


def test_the_loop_runs_the_config_it_is_given_and_only_checks_it_against_the_checkpoint(pydoc_data, tmp_path):
    """The merge with the checkpoint happened before (the notebook's start, `lab train`'s flags):
    the loop merges nothing again, and a config that was not settled is refused, not patched."""
    code, out, err = lab_here("train", *RUN, "--steps-until", "3", "--out", str(tmp_path / "run"))
    assert code == 0, out + err
    settled = RunConfig.from_dict({**json.loads((tmp_path / "run" / "config.json").read_text()),
                                   "steps_until": 5, "lr": 1e-3})
    trainer = Trainer(settled, tmp_path / "run", pydoc_data, resume=tmp_path / "run", log=lambda s: None)
    assert trainer.cfg is settled and trainer.step == 3
    unsettled = RunConfig(constellations=["pydoc"], steps_until=5)  # the defaults' width, not the run's
    with pytest.raises(ConfigError, match="width is locked when continuing: the checkpoint has width=32"):
        Trainer(unsettled, tmp_path / "run", pydoc_data, resume=tmp_path / "run", log=lambda s: None)
