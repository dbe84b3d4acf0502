"""The "own card" machine: the training notebook executed here by papermill.

One link of a run: the notebook is parameterized with the run's fields, executed with the
run folder as its working directory (metrics, checkpoints and the plot land there), and
kept as `links/<n>-local.ipynb`. Progress streams to the terminal while it runs.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from lab.config import RunConfig, card_set
from lab.kernel.checkpoint import checkpoint_meta, checkpoint_step, list_checkpoints
from lab.machines.auto import Machine
from lab.machines.base import Follow, Host
from lab.machines.control import set_control, tail
from lab.notebooks import TRAIN_NOTEBOOK, parameterized
from lab.procs import descendants, forwarding_stop_signals, signal_quietly
from lab.runs import End, Link, Outcome, Run, now, updating

NAME = "local"
_local_cards: list[str] | None = None


def local_cards() -> list[str]:
    """nvidia-smi's "name, memory" line for each card of this computer, asked once; empty
    without a card. Found without importing torch."""
    global _local_cards
    if _local_cards is None:
        _local_cards = _query_cards()
    return _local_cards


def _query_cards() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def local_gpu() -> str:
    """This computer's card as the sizing calculator names it."""
    cards = local_cards()
    if not cards:
        return "cpu"
    return card_set(cards[0].split(",")[0], len(cards))


class LocalHost(Host):
    """This computer: the training notebook executed here by papermill, inside the driver's
    process, so the session lives exactly as long as its driver."""

    kind = "local"
    one_link_per_start = True
    session_in_driver = True

    def __init__(self, name: str = NAME):
        super().__init__(name)

    @classmethod
    def names(cls) -> list[str]:
        return [NAME]

    def state(self, running: list[str], patient: bool = False) -> Machine:
        return Machine(NAME, "local", local_gpu(), running=running, free=not running)

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        with updating(run.id) as r:
            link = Link(n=len(r.links) + 1, machine=NAME, kind=self.kind, status="running", from_step=r.step)
            link.notebook = f"links/{link.n:03d}-{NAME}.ipynb"
            r.links.append(link)
            r.status = "running"
        return link

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        if not how.fresh:
            return _abandon(run, link, how.say)
        if list_checkpoints(run.folder / "checkpoints"):
            resume = run.folder
        elif run.parent and run.parent.get("checkpoint"):
            resume = Path(run.parent["checkpoint"])
        else:
            resume = None
        set_control(run.id, message="running on this computer", message_ru="идёт на этом компьютере",
                    waiting_until=None)
        how.say(f"link {link.n} on this computer")
        ended = execute_link(run, link, run.cfg, Path(run.cfg.data_dir), resume, progress=how.progress,
                             nproc=how.nproc)
        how.say(f"run {run.id}: link {ended.n} {ended.status} at step {ended.to_step} ({ended.reason})")
        return ended

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        if driver_pid:
            # To the notebook's kernel (and torchrun's workers), not the driver: the loop's saver
            # catches it, saves a checkpoint and stops cleanly, and the driver records the link.
            for child in descendants(driver_pid):
                signal_quietly(child, signal.SIGINT)
        return f"run {run.id}: the session on this computer saves a checkpoint and stops"

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        return tail(run.folder / "driver.log", lines) or tail(run.folder / "control.log", lines)


def _abandon(run: Run, link: Link, say) -> Link:
    """A link whose driver died: its session died with it (papermill ran in the driver)."""
    step = _last_checkpoint_step(run.folder)
    with updating(run.id) as r:
        last = r.links[link.n - 1]
        last.status, last.ended = "failed", now()
        last.reason = "the control process stopped while it ran"
        # The run goes on: nothing of the session's own failed.
        last.outcome = Outcome(End.INTERRUPTED, last.reason, "управляющий процесс остановился, пока сессия шла")
        last.to_step = step if step and step > last.from_step else None
    say(f"link {link.n} on this computer: {last.reason}; the run goes on from step {step or 0}")
    return last


def execute_link(run: Run, link: Link, cfg: RunConfig, data_dir: Path, resume: Path | None, *,
                 progress: bool = True, nproc: int = 0) -> Link:
    """Runs the session of `link` here and records how it ended; returns the ended link. A
    session that failed fails the run: the person looks at the notebook before it goes on."""
    import papermill as pm  # papermill: only where a session runs here

    out_nb = run.folder / link.notebook
    out_nb.parent.mkdir(exist_ok=True)
    cfg = replace(cfg, data_dir=str(data_dir), resume_from=str(resume) if resume else "")  # where, here
    params = parameterized(cfg, out_dir=str(run.folder), nproc=nproc, plot_every_s=30)  # every field, as settled
    (run.folder / "result.json").unlink(missing_ok=True)  # the previous link's
    error = None
    try:
        # The kernel's own stdout (the loop's progress lines) streams to this terminal.
        streams = {"stdout_file": sys.stdout, "stderr_file": sys.stderr} if progress else {}
        with forwarding_stop_signals(say=lambda m: print(m, file=sys.stderr, flush=True)):
            pm.execute_notebook(str(TRAIN_NOTEBOOK), str(out_nb), parameters=params, cwd=str(run.folder),
                                progress_bar=False, kernel_name="python3", **streams)
    except pm.PapermillExecutionError as e:
        error = f"{e.ename}: {e.evalue}"
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as e:  # noqa: BLE001 - a dead kernel, no kernelspec: the link is recorded failed
        error = f"{type(e).__name__}: {e}"
    result = _read_result(run.folder)
    with updating(run.id) as r:
        link = r.links[link.n - 1]
        link.ended = now()
        if result and not error:
            link.to_step, link.reason = result["step"], result["reason"]
            link.status = "done" if result["done"] else "stopped"
            link.checkpoint = _checkpoint_meta(result.get("checkpoint"))
            link.outcome = Outcome(End.CONTINUE, link.reason)
        else:
            link.status, link.reason = "failed", error or "the notebook wrote no result"
            link.to_step = _last_checkpoint_step(run.folder)
            link.outcome = _failed(run.id, link.reason, out_nb) if error else Outcome(End.LOST, link.reason)
        r.status = link.status
    return link


def _failed(run_id: str, error: str, notebook: Path) -> Outcome:
    return Outcome(End.FAILED, f"run {run_id} failed: {error}. The executed notebook is {notebook}; "
                               f"`lab watch {run_id}` continues it from the last checkpoint",
                   f"прогон {run_id} упал: {error}. Выполненный блокнот: {notebook}; `lab watch {run_id}` "
                   "продолжит его с последнего чекпоинта")


def _read_result(folder: Path) -> dict | None:
    path = folder / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


def _checkpoint_meta(path: str | None) -> dict | None:
    if not path:
        return None
    meta = checkpoint_meta(path)
    return {"name": Path(path).name, "step": meta["step"], "sha256": meta["sha256"]}


def _last_checkpoint_step(folder: Path) -> int | None:
    found = list_checkpoints(folder / "checkpoints")
    return checkpoint_step(found[-1]) if found else None
