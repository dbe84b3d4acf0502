"""This computer, in the driving process itself: the training loop without the notebook (the path
`lab train` takes), so a tiny CPU sweep (`lab sweep --inline`) starts no kernel per run. Not listed among
the lab's machines: a run registered for `inline` goes there by name."""
from __future__ import annotations

from pathlib import Path

from lab.kernel.checkpoint import list_checkpoints
from lab.machines.base import Follow
from lab.machines.ending import Facts, Said, ended
from lab.machines.handoff import read_outputs
from lab.machines.local import LocalHost
from lab.runs import Link, Run, now, updating

STOP_FILE = "inline-stop"  # in the run folder: the loop stops at its next step boundary, saving first


class InlineHost(LocalHost):
    kind = "inline"
    listed = False  # not among the lab's machines: only a run registered for it goes there
    keeps_notebook = False

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        from lab.kernel.train import train  # torch: only where a link trains in this process
        stop = run.folder / STOP_FILE
        stop.unlink(missing_ok=True)
        resume = run.folder if list_checkpoints(run.folder / "checkpoints") else None
        error, result = None, None
        try:
            result = train(run.cfg, run.folder, Path(run.cfg.data_dir), resume=resume, log=lambda s: None,
                           stop_file=stop)
        except Exception as e:  # noqa: BLE001 - recorded on the link as its outcome
            error = f"{type(e).__name__}: {e}"
        finally:
            stop.unlink(missing_ok=True)
        out = read_outputs(run.folder)
        out = out if result is None else type(out)(**{**out.to_dict(), "result": result})
        end = ended(Facts("this process", Said.EXITED, out, link.from_step, cancel_asked=how.cancelled(),
                          error=error))
        with updating(run.id) as r:
            last = r.links[link.n - 1]
            last.status, last.reason, last.ended, last.outcome = end.status, end.reason, now(), end.outcome
            last.to_step = int(result["step"]) if result else (out.checkpoint or {}).get("step", r.step)
            r.status = end.status
        return last

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        ask_to_stop(run.folder, "cancelled")
        return f"run {run.id}: the loop in this process saves a checkpoint and stops"

    def cards(self) -> str | None:
        return "cpu"

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        return ""


def ask_to_stop(folder: Path, why: str) -> None:
    """The loop running a run of this folder in this process saves at its next step and stops, for `why`."""
    (folder / STOP_FILE).write_text(why, encoding="utf-8")
