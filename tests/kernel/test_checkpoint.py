import os
import random
import resource
import signal

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import ROOT
from lab.kernel import checkpoint as checkpoint
from lab.kernel import saver


def _state(step):
    return {"step": step, "tokens": step * 10, "model": {"w": torch.full((4,), float(step))}, "config": {}}


def test_saves_atomically_and_keeps_the_newest_two(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save_checkpoint(_state(step), tmp_path)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt_00000020.pt", "ckpt_00000030.pt"]
    assert not list(tmp_path.glob(".*.tmp"))
    assert checkpoint.load_checkpoint(checkpoint.resolve_checkpoint(tmp_path))["step"] == 30


@pytest.mark.parametrize("schedule,kept", [("wsd", [20, 40, 60, 80, 95, 100]), ("inv_sqrt", [80, 95, 100]),
                                           ("cosine", [95, 100])])
def test_pruning_keeps_the_stable_phases_quarters_and_the_pre_decay_checkpoint(tmp_path, schedule, kept):
    # 100 steps decaying over the last 20%: a WSD run keeps the quarters of its constant phase (20, 40,
    # 60 and 80, where its decay begins) for cooldown branches; a finished run grows from step 80.
    config = {"schedule": schedule, "steps_until": 100, "decay_frac": 0.2, "decay_start": 0}
    for step in (10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 100):
        checkpoint.save_checkpoint({**_state(step), "config": config}, tmp_path)
    assert [checkpoint.checkpoint_step(p) for p in checkpoint.list_checkpoints(tmp_path)] == kept
    assert checkpoint.pre_decay_checkpoint(checkpoint.list_checkpoints(tmp_path)) == (tmp_path / "ckpt_00000080.pt" if schedule != "cosine" else None)


def test_between_its_marks_a_wsd_run_keeps_the_newest_checkpoint_before_each():
    cfg = SimpleNamespace(schedule="wsd", steps_until=1000, decay_frac=0.2, decay_start=0)
    assert saver.stable_marks(cfg) == [200, 400, 600, 800]
    assert saver.kept_steps([150, 300, 350, 700, 790, 810, 820], cfg) == {150, 350, 790, 810, 820}
    assert saver.stable_marks(SimpleNamespace(schedule="wsd", steps_until=3000, decay_frac=0.2, decay_start=2000)) \
        == [500, 1000, 1500, 2000]  # a branch's or a stage's own decay start


def test_a_wsd_run_saves_at_its_stable_phases_quarters_and_keeps_them_to_branch_from(pydoc_data, tmp_path):
    from lab.config import RunConfig
    from lab.kernel.train import train
    cfg = RunConfig(context=32, width=32, heads=2, layers=2, batch_per_card=2, eval_every=100, eval_batches=1,
                    warmup_steps=2, steps_until=20, schedule="wsd", precision="fp32", torch_compile="off")
    result = train(cfg, tmp_path, pydoc_data, log=lambda s: None)
    assert result["done"] and result["step"] == 20
    # Decay from step 16 (the last 20%): saved at 4, 8, 12 and 16 without a timed save, and kept.
    assert [checkpoint.checkpoint_step(p) for p in checkpoint.list_checkpoints(tmp_path / "checkpoints")] == \
        [4, 8, 12, 16, 20]


def test_a_truncated_newest_checkpoint_is_detected_and_not_silently_skipped(tmp_path):
    checkpoint.save_checkpoint(_state(10), tmp_path)
    newest = checkpoint.save_checkpoint(_state(20), tmp_path)
    with open(newest, "r+b") as f:
        f.truncate(newest.stat().st_size // 2)
    with pytest.raises(checkpoint.CheckpointError, match="truncated.*--allow-fallback"):
        checkpoint.resolve_checkpoint(tmp_path)
    assert checkpoint.resolve_checkpoint(tmp_path, allow_fallback=True).name == "ckpt_00000010.pt"


def test_a_corrupt_checkpoint_file_is_refused(tmp_path):
    path = checkpoint.save_checkpoint(_state(10), tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="sha256 does not match"):
        checkpoint.resolve_checkpoint(path)


def test_a_save_interrupted_before_its_sidecar_is_no_checkpoint_and_the_next_save_cleans_it(tmp_path):
    checkpoint.save_checkpoint(_state(10), tmp_path)
    unfinished = checkpoint.save_checkpoint(_state(20), tmp_path)
    unfinished.with_suffix(".json").unlink()  # killed between the .pt's rename and the sidecar's
    (tmp_path / ".ckpt_00000030.pt.tmp").write_bytes(b"half a save")
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt_00000010.pt"]
    assert checkpoint.resolve_checkpoint(tmp_path).name == "ckpt_00000010.pt"  # no flag needed
    assert "never finished" in checkpoint.verify_checkpoint(unfinished)  # named directly, it says why
    checkpoint.save_checkpoint(_state(11), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_00000010.json", "ckpt_00000010.pt",
                                                          "ckpt_00000011.json", "ckpt_00000011.pt"]


def test_the_sidecar_records_the_sha256_and_size_of_the_bytes_on_disk(tmp_path):
    path = checkpoint.save_checkpoint(_state(7), tmp_path)
    meta = checkpoint.checkpoint_meta(path)
    assert meta["sha256"] == checkpoint.sha256_file(path) and meta["bytes"] == path.stat().st_size


def test_a_checkpoint_loads_as_data_with_weights_only(tmp_path):
    from lab.kernel.runtime import rng_state, set_rng_state
    state = {**_state(5), "rng": [rng_state()], "format": checkpoint.FORMAT}
    path = checkpoint.save_checkpoint(state, tmp_path)
    loaded = torch.load(path, weights_only=True)
    expected = random.random(), np.random.rand(), torch.rand(1)
    set_rng_state(loaded["rng"][0])
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_a_format_1_checkpoint_with_numpy_rng_state_still_loads_and_resumes_its_rngs(tmp_path):
    from lab.kernel.runtime import set_rng_state
    old_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": []}
    torch.save({**_state(5), "rng": [old_rng], "format": 1}, tmp_path / "old.pt")
    expected = np.random.rand()
    state = checkpoint.load_checkpoint(tmp_path / "old.pt")
    set_rng_state(state["rng"][0])
    assert np.random.rand() == expected


class Payload:  # any class: unpickling it could run code
    pass


def test_a_checkpoint_holding_objects_is_refused_with_a_clear_message(tmp_path):
    torch.save({**_state(5), "extra": Payload()}, tmp_path / "odd.pt")
    with pytest.raises(checkpoint.CheckpointError, match="objects other than tensors and plain values.*not loaded"):
        checkpoint.load_checkpoint(tmp_path / "odd.pt")


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_says_so(tmp_path):
    checkpoint.save_checkpoint(_state(10), tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    big = {**_state(20), "model": {"w": torch.zeros(1 << 20)}}  # 4 MiB: more than the file size limit
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, old_limit[1]))
    try:
        with pytest.raises(checkpoint.CheckpointSaveError) as err:
            checkpoint.save_checkpoint(big, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert "could not save checkpoint ckpt_00000020.pt" in str(err.value)
    assert "the disk is full" in str(err.value)
    assert "ckpt_00000010.pt (step 10) is kept" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no partial file is left behind"
    assert checkpoint.resolve_checkpoint(tmp_path).name == "ckpt_00000010.pt"


def test_a_folder_without_checkpoints_says_so(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint"):
        checkpoint.resolve_checkpoint(tmp_path)


def test_stop_guard_turns_sigterm_into_a_flag():
    with saver.StopGuard(limit_min=60) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.reason(step_s=0.1, save_s=0.1) == "SIGTERM received"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_stop_guard_stops_before_the_limit_leaving_time_for_a_step_and_a_save():
    guard = saver.StopGuard(limit_min=1.0, margin_s=0)
    assert guard.reason(step_s=1, save_s=1) is None
    assert guard.reason(step_s=30, save_s=15) == "time limit"


def test_kill_9_at_random_moments_never_needs_a_flag_nor_leaves_a_corrupt_checkpoint(pydoc_data, tmp_path,
                                                                                     monkeypatch):
    """30 kills of a run saving every step; each plain resume continues from the newest whole
    checkpoint, and the curve equals an uninterrupted run's. (`scripts/kill9_trials.py` runs more.)"""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the forkserver's children import the trial from there
    import kill9_trials
    figures = kill9_trials.run_trials(30, pydoc_data, tmp_path / "run", seed=1, window_s=(0.03, 0.2))
    assert figures["trials"] == figures["plain_resumes"] == 30, figures
    assert figures["needed_flag"] == figures["corrupt"] == figures["child_errors"] == 0, figures
    assert figures["final_step"] > figures["steps"][0], "the run moved on between kills"
    assert figures["curve_exact"], "every resume continued exactly where its checkpoint was"


def test_stop_guard_stops_when_the_launcher_writes_the_stop_file(tmp_path):
    guard = saver.StopGuard(limit_min=60, stop_file=tmp_path / "stop")
    assert guard.reason(step_s=0.1, save_s=0.1) is None
    (tmp_path / "stop").write_text("SIGINT received")
    assert guard.reason(step_s=0.1, save_s=0.1) == "SIGINT received"


def test_training_whose_final_save_fails_goes_on_and_names_the_previous_checkpoint(pydoc_data, tmp_path):
    from lab.config import RunConfig
    from lab.kernel.train import train
    cfg = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=100, warmup_steps=2,
               schedule="cosine")  # no stable phase: its only checkpoint is its last
    train(RunConfig(**cfg, steps_until=3), tmp_path, pydoc_data, log=lambda s: None)
    said = []
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, old_limit[1]))  # the metrics fit, a checkpoint does not
    try:
        result = train(RunConfig(**cfg, steps_until=5, resume_from=str(tmp_path)), tmp_path, pydoc_data,
                       resume=tmp_path, log=said.append)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert result["trained_to"] == 5 and result["step"] == 3 and not result["done"]
    assert result["checkpoint"].endswith("ckpt_00000003.pt") and "the disk is full" in result["save_failed"]
    assert any("ckpt_00000003.pt (step 3) is kept" in line for line in said)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "checkpoints")] == ["ckpt_00000003.pt"]
