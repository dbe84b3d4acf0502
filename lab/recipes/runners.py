"""How a sweep runs its runs: one after another here (the notebook, or this process), or
spread over the lab's machines by Auto. Each runner takes a registered run through one
link and stops a diverging one early, marking it (`points.DIVERGED`) so it is no point.

    LocalRunner   the training notebook on this computer (the path `lab run` takes)
    InlineRunner  the loop in this process, without the notebook (`lab train`'s path; fast on CPU)
    SpreadRunner  a background driver per run; Auto places each on a free Kaggle account
"""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Callable

from lab.config import UserError
from lab.recipes.points import DivergenceWatch, diverged_why, mark_diverged
from lab.machines.outcome import End, Outcome
from lab.runs import Link, load_run, now, updating


START_GRACE_S = 120  # how long a spawned driver may take to mark its run running


class Diverged(Exception):
    """Raised from the loop's metrics callback to stop a diverging run at once."""


class InlineRunner:
    """Trains in this process: no kernel start per run, so tiny CPU sweeps finish in seconds."""
    blocking = True

    def __init__(self, say: Callable[[str], None] = print, watch: Callable[[], DivergenceWatch] = DivergenceWatch):
        self.say, self.watch = say, watch

    def launch(self, run_id: str) -> None:
        from lab.kernel.checkpoint import list_checkpoints
        from lab.kernel.train import train
        from lab.machines.needs import pin_data
        pin_data(run_id, self.say)  # as a driver does: found (or prepared) once, then kept in the config
        run = load_run(run_id)
        cfg, data = run.cfg, Path(run.cfg.data_dir)
        resume = run.folder if list_checkpoints(run.folder / "checkpoints") else None
        with updating(run_id) as r:
            # This computer's session, run in this process (the machine's name says how).
            r.links.append(Link(n=len(r.links) + 1, machine="inline", kind="local", status="running",
                                from_step=r.step))
            r.status = "running"
        watch = self.watch()

        def on_metrics(row: dict) -> None:
            why = watch.see(row)
            if why:
                raise Diverged(why)

        status, reason, step = "failed", None, None
        try:
            result = train(cfg, run.folder, data, resume=resume, log=lambda s: None,
                           on_metrics=on_metrics)
            status = "done" if result["done"] else "stopped"
            reason, step = result["reason"], result["step"]
        except Diverged as e:
            mark_diverged(run.folder, str(e))
            reason = f"diverged: {e}"
        except Exception as e:  # noqa: BLE001 - recorded on the link, the sweep goes on with the rest
            reason = f"{type(e).__name__}: {e}"
        with updating(run_id) as r:
            link = r.links[-1]
            link.status, link.reason, link.ended = status, reason, now()
            # As any machine ends a link: a driver that later continues this run decides from it.
            link.outcome = Outcome(End.FAILED if status == "failed" else End.CONTINUE, reason or "")
            link.to_step = step if step is not None else r.step
            r.status = status

    def finished(self, run_id: str) -> bool:
        return True


class LocalRunner:
    """The training notebook here, through the driver, one run at a time (`lab sweep` registers
    its runs for "local" then). A thread watches the run's metrics and stops a diverging run the
    way Ctrl-C does: SIGTERM to the kernel, which saves and stops."""
    blocking = True

    def __init__(self, say: Callable[[str], None] = print, poll_s: float = 2.0,
                 watch: Callable[[], DivergenceWatch] = DivergenceWatch):
        self.say, self.poll_s, self.watch = say, poll_s, watch

    def launch(self, run_id: str) -> None:
        from lab.machines import driver
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
        import os
        from lab.procs import descendants, signal_quietly
        folder, watch, seen = load_run(run_id).folder, self.watch(), 0
        while True:
            ended = stop.wait(self.poll_s)
            rows, seen = _new_rows(folder, seen)
            for row in rows:
                why = watch.see(row)
                if why:
                    mark_diverged(folder, why, row.get("step"))
                    if not ended:
                        for pid in descendants(os.getpid()):
                            signal_quietly(pid, signal.SIGTERM)
                    return
            if ended:
                return

    def finished(self, run_id: str) -> bool:
        return True


class SpreadRunner:
    """Each run in its own background driver: Auto spreads them over free accounts (the
    driver waits for quota when none is free). A diverging run is cancelled from here."""
    blocking = False

    def __init__(self, say: Callable[[str], None] = print, watch: Callable[[], DivergenceWatch] = DivergenceWatch):
        self.say, self.watch = say, watch
        self._watches: dict[str, tuple[DivergenceWatch, int]] = {}
        self._launched: dict[str, float] = {}

    def launch(self, run_id: str) -> None:
        from lab.machines import driver
        driver.spawn_driver(run_id, resume=True)
        self._watches[run_id] = (self.watch(), 0)
        self._launched[run_id] = time.monotonic()

    def finished(self, run_id: str) -> bool:
        from lab.machines import driver
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
        busy = starting or run.status in ("running", "waiting", "starting") or driver.driver_alive(run_id)
        return not busy


def _new_rows(folder: Path, seen: int) -> tuple[list[dict], int]:
    """Metrics rows after the first `seen` (the file only grows while a link runs)."""
    from lab.kernel.metrics import read_metrics
    rows = read_metrics(folder)
    return rows[seen:], len(rows)
