"""How a sweep runs its runs: one after another here (the notebook, or this process), or
spread over the lab's machines by Auto. Each runner takes a registered run through one
link and stops a diverging one early, marking it (`points.DIVERGED`) so it is no point.

    LocalRunner   the training notebook on this computer (the path `lab run` takes)
    InlineRunner  the loop in this process, without the notebook (the `inline` machine; fast on CPU)
    SpreadRunner  a background driver per run; Auto places each on a free Kaggle account
"""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.kernel.metrics import read_metrics
from lab.machines import driver
from lab.machines.control import driver_alive, spawn_driver
from lab.machines.local import ask_to_stop
from lab.procs import signal_session
from lab.recipes.points import DivergenceWatch, diverged_why, mark_diverged
from lab.runs import load_run


START_GRACE_S = 120  # how long a spawned driver may take to mark its run running


class DrivenRunner:
    """One run at a time through the driver, in this process, on `machine`. A thread watches the
    run's metrics and stops a diverging run's session (`stop`): it saves and stops, and the run
    reads "stopped", not cancelled."""
    blocking = True
    machine = "local"

    def __init__(self, say: Callable[[str], None] = print, poll_s: float = 2.0,
                 watch: Callable[[], DivergenceWatch] = DivergenceWatch):
        self.say, self.poll_s, self.watch = say, poll_s, watch

    def launch(self, run_id: str) -> None:
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(run_id, stop), daemon=True)
        watcher.start()
        try:
            driver.drive(run_id, say=lambda s: None, progress=False)
        except UserError as e:
            self.say(f"{run_id}: {e}")
        finally:
            stop.set()
            watcher.join()

    def _watch(self, run_id: str, stop: threading.Event) -> None:
        """Reads the run's new metrics rows every `poll_s`; after the link, once more, so a run
        that diverged faster than a poll is still marked."""
        folder, watch, seen = load_run(run_id).folder, self.watch(), 0
        while True:
            ended = stop.wait(self.poll_s)
            rows, seen = _new_rows(folder, seen)
            for row in rows:
                why = watch.see(row)
                if why:
                    mark_diverged(folder, why, row.get("step"))
                    if not ended:
                        self.stop(run_id)
                    return
            if ended:
                return

    def finished(self, run_id: str) -> bool:
        return True


    def stop(self, run_id: str) -> None:
        raise NotImplementedError


class LocalRunner(DrivenRunner):
    """The training notebook on this computer (the path `lab run` takes): a diverging run is
    stopped the way Ctrl-C stops it, SIGTERM to its session (the kernel working in the run's
    folder, and its workers), which saves and stops. Nothing else this process started hears it."""
    machine = "local"

    def stop(self, run_id: str) -> None:
        signal_session(load_run(run_id).folder, signal.SIGTERM)


class InlineRunner(DrivenRunner):
    """The loop in this process without the notebook (lab.machines.local's `inline`): no kernel start per
    run, so tiny CPU sweeps finish in seconds."""
    machine = "inline"

    def __init__(self, say: Callable[[str], None] = print, poll_s: float = 0.2,
                 watch: Callable[[], DivergenceWatch] = DivergenceWatch):
        super().__init__(say, poll_s, watch)

    def stop(self, run_id: str) -> None:
        ask_to_stop(load_run(run_id).folder, "diverged")


class SpreadRunner:
    """Each run in its own background driver: Auto spreads them over free accounts (the
    driver waits for quota when none is free). A diverging run is cancelled from here."""
    blocking = False
    machine = None  # wherever each run's own field says (Auto, or the machine the sweep was given)

    def __init__(self, say: Callable[[str], None] = print, watch: Callable[[], DivergenceWatch] = DivergenceWatch):
        self.say, self.watch = say, watch
        self._watches: dict[str, tuple[DivergenceWatch, int]] = {}
        self._launched: dict[str, float] = {}

    def launch(self, run_id: str) -> None:
        spawn_driver(run_id, resume=True)
        self._watches[run_id] = (self.watch(), 0)
        self._launched[run_id] = time.monotonic()

    def finished(self, run_id: str) -> bool:
        run = load_run(run_id)
        watch, seen = self._watches.get(run_id, (self.watch(), 0))
        rows, seen = _new_rows(run.folder, seen)
        self._watches[run_id] = (watch, seen)
        for row in rows:
            why = watch.see(row)
            if why and not diverged_why(run.folder):
                mark_diverged(run.folder, why, row.get("step"))
                driver.cancel(run_id)
        # A driver just spawned may not have taken the run yet: "new" counts as busy for a while.
        starting = run.status == "new" and time.monotonic() - self._launched.get(run_id, 0) < START_GRACE_S
        busy = starting or run.status in ("running", "waiting", "starting") or driver_alive(run_id)
        return not busy


def _new_rows(folder: Path, seen: int) -> tuple[list[dict], int]:
    """Metrics rows after the first `seen` (the file only grows while a link runs)."""
    rows = read_metrics(folder)
    return rows[seen:], len(rows)
