"""The sizing calculator as the faces use it: the figures' words and kinds, "when to grow" for a
run folder, how far past predictions were, and this computer's parts measured once.

    parts_wanted(est)          (precision, threads) when the estimate is for this computer and its
                               parts are not measured yet in that precision on those threads
    measure_parts(precision)   the short microbenchmark (lab.trial.parts) in a process of its own, on
                               the threads a run here takes; kept under the lab home for the calculator
    measure_in_background(...) the same without waiting (the form: it sizes on every keystroke)
    auto_measure()             whether the calculator measures on its own when it first needs to
                               (LAB_MEASURE_PARTS=0 turns it off: `lab size --measure-parts` still does)
    busy()                     the load per core when other work keeps this computer busy (then the
                               calculator waits for a quiet moment: parts timed beside a training run
                               would carry its contention into the model's shape)
    grow(run, manifest, vocab) "when to grow" from a run id or folder
    calibration()              one line: the speed predictions against what the runs measured
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from lab.config import ConfigError, RunConfig, UserError
from lab.home import KIT, runs_dir
from lab.kernel.metrics import read_metrics
from lab.recipes.predict import predicted_text  # noqa: F401 (the faces' words for the fitted loss)
from lab.sizing import (DEFAULT_VOCAB, KIND_RU, Estimate, Figure, Verdict, find_manifest,  # noqa: F401
                        format_count, format_hours, format_number, slowdown, when_to_grow)
from lab.sizing.calibration import summary
from lab.sizing.machine import BUSY_LOAD, local_file, local_shape, save_local, unsteady_local
from lab.sizing.priors import cpu_threads

AUTO_ENV = "LAB_MEASURE_PARTS"
MEASURE_TIMEOUT_S = 300.0


def auto_measure() -> bool:
    return os.environ.get(AUTO_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


def load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):  # not a Unix: no load average to go by
        return 0.0


def busy() -> float | None:
    """The 1-minute load average per core when it is above BUSY_LOAD (lab.sizing.machine), else None."""
    load = load_per_core()
    return load if load > BUSY_LOAD else None


def parts_wanted(est: Estimate) -> tuple[str, int] | None:
    """(precision, threads) of this computer's parts the estimate would use and does not have."""
    if est.gpu != "cpu" or est.precision not in ("fp32", "bf16"):
        return None
    threads = cpu_threads()
    return None if local_shape(est.precision, threads) is not None else (est.precision, threads)


def measure_parts(precision: str, threads: int | None = None) -> Path:
    """Measures this computer's parts in `precision` on `threads` (default: the threads a run here
    takes) in a process of its own (torch stays out of the caller), keeps them; their file."""
    threads = threads or cpu_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(KIT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    try:
        proc = subprocess.run([sys.executable, "-m", "lab.trial.parts", precision], capture_output=True, text=True,
                              env=env, timeout=MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"measuring this computer's parts took over {MEASURE_TIMEOUT_S:.0f} s; the calculator "
                        f"keeps the lab's prior") from None
    if proc.returncode != 0:
        raise UserError(f"measuring this computer's parts failed: {proc.stderr.strip()[-500:]}")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    if int(record.get("threads") or 0) != threads:  # torch took another count than asked
        raise UserError(f"the measurement ran on {record.get('threads')} thread(s), not {threads}")
    return save_local(record)


_background: dict[str, threading.Thread] = {}  # by the file each measurement writes (per lab home)
_failed: dict[str, str] = {}


def measure_in_background(precision: str, threads: int) -> str:
    """Starts measuring (once per lab home, precision and threads in this process) unless it is
    under way or done, or this computer is busy; "measuring", "done", "busy", "unsteady" (measured,
    but beside other work: not used) or "failed: why"."""
    if local_shape(precision, threads) is not None:
        return "done"
    key = str(local_file(precision, threads))
    if key in _failed:
        return f"failed: {_failed[key]}"
    thread = _background.get(key)
    if thread is None and busy():
        return "busy"
    if thread is None:
        def work() -> None:
            try:
                measure_parts(precision, threads)
            except (UserError, OSError, ValueError) as e:
                _failed[key] = str(e)
        thread = _background[key] = threading.Thread(target=work, name="lab-parts", daemon=True)
        thread.start()
    if thread.is_alive():
        return "measuring"
    if unsteady_local(precision, threads) is not None:
        return "unsteady"  # measured beside other work: not used (`lab size --measure-parts` again)
    return "done" if local_shape(precision, threads) is not None else f"failed: {_failed.get(key, 'no result')}"


def grow(run: str, manifest: dict | None = None, vocab: int | None = None) -> Verdict:
    """The guide's "when to grow" for a run id or a run folder, from its val history."""
    folder = Path(run)
    if not folder.is_dir():
        folder = runs_dir() / run
    if not (folder / "metrics.jsonl").is_file():
        raise UserError(f"no metrics.jsonl in {folder}: give a run id or a run folder")
    cfg = RunConfig()
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        known = set(cfg.to_dict())
        cfg = RunConfig.from_dict({k: v for k, v in data.items() if k in known})
    except (OSError, ValueError, AttributeError, ConfigError):
        pass  # no config, or an old run's odd field: size it as the defaults
    if manifest is None:
        manifest = find_manifest(cfg)
    return when_to_grow(read_metrics(folder), manifest, cfg, vocab)


def calibration() -> str:
    return summary()
