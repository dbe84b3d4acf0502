"""This computer, in the driving process itself: the training loop without the notebook (the path
`lab train` takes), so a tiny CPU sweep (`lab sweep --inline`) starts no kernel per run.

A machine like any other to the driver: it starts a link, follows it to its end with a typed
outcome, and cancels it (the loop's stop file: it saves at the next step boundary and stops). It
is not listed among the lab's machines and Auto never picks it; a run registered for `inline`
goes there by name.
"""
from __future__ import annotations

from pathlib import Path

from lab.kernel.checkpoint import list_checkpoints
from lab.kernel.train import train
from lab.machines.auto import Machine
from lab.machines.base import Follow, Host
from lab.runs import End, Link, Outcome, Run, now, updating

NAME = "inline"
STOP_FILE = "inline-stop"  # in the run folder: the loop stops at its next step boundary, saving first


class InlineHost(Host):
    kind = "inline"
    one_link_per_start = True
    session_in_driver = True
    listed = False  # not among the lab's machines: only a run registered for it goes there

    def __init__(self, name: str = NAME):
        super().__init__(name)

    @classmethod
    def names(cls) -> list[str]:
        return [NAME]

    def state(self, running: list[str], patient: bool = False) -> Machine:
        # This computer to the Auto rule (`pick`), which offers it only when the run names it.
        return Machine(NAME, "local", "cpu", running=running, free=not running)

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        with updating(run.id) as r:
            link = Link(n=len(r.links) + 1, machine=NAME, kind=self.kind, status="running", from_step=r.step)
            r.links.append(link)
            r.status = "running"
        return link

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        stop = run.folder / STOP_FILE
        stop.unlink(missing_ok=True)
        resume = run.folder if list_checkpoints(run.folder / "checkpoints") else None
        status, reason, step, error = "failed", None, None, None
        try:
            result = train(run.cfg, run.folder, Path(run.cfg.data_dir), resume=resume, log=lambda s: None,
                           stop_file=stop)
            status = "done" if result["done"] else "stopped"
            reason, step = result["reason"], result["step"]
        except Exception as e:  # noqa: BLE001 - recorded on the link as its outcome
            reason = error = f"{type(e).__name__}: {e}"
        finally:
            stop.unlink(missing_ok=True)
        with updating(run.id) as r:
            ended = r.links[link.n - 1]
            ended.status, ended.reason, ended.ended = status, reason, now()
            ended.outcome = Outcome(End.FAILED if error else End.CONTINUE, reason or "")
            ended.to_step = step if step is not None else r.step
            r.status = status
        return ended

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        ask_to_stop(run.folder, "cancelled")
        return f"run {run.id}: the loop in this process saves a checkpoint and stops"

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        return ""


def ask_to_stop(folder: Path, why: str) -> None:
    """The loop running a run of this folder in this process saves at its next step boundary and
    stops, giving `why` as its reason."""
    (folder / STOP_FILE).write_text(why, encoding="utf-8")
