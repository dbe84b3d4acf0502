import os
import signal

import pytest
import torch

from lab.kernel import checkpoint as checkpoint


def _state(step):
    return {"step": step, "tokens": step * 10, "model": {"w": torch.full((4,), float(step))}, "config": {}}


def test_saves_atomically_and_keeps_the_newest_two(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save_checkpoint(_state(step), tmp_path)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt_00000020.pt", "ckpt_00000030.pt"]
    assert not list(tmp_path.glob(".*.tmp"))
    assert checkpoint.load_checkpoint(checkpoint.resolve_checkpoint(tmp_path))["step"] == 30


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


def test_a_save_that_never_finished_has_no_sidecar_and_is_not_used(tmp_path):
    checkpoint.save_checkpoint(_state(10), tmp_path)
    unfinished = checkpoint.save_checkpoint(_state(20), tmp_path)
    unfinished.with_suffix(".json").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="never finished"):
        checkpoint.resolve_checkpoint(tmp_path)


def test_a_folder_without_checkpoints_says_so(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint"):
        checkpoint.resolve_checkpoint(tmp_path)


def test_stop_guard_turns_sigterm_into_a_flag():
    with checkpoint.StopGuard(limit_min=60) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.reason(step_s=0.1, save_s=0.1) == "SIGTERM received"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_stop_guard_stops_before_the_limit_leaving_time_for_a_step_and_a_save():
    guard = checkpoint.StopGuard(limit_min=1.0, margin_s=0)
    assert guard.reason(step_s=1, save_s=1) is None
    assert guard.reason(step_s=30, save_s=15) == "time limit"
