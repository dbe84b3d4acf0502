"""This computer as a machine. `local`, the "own card" machine: a link's training notebook executed here by
papermill with the run folder as its working directory, kept as `links/<n>-local.ipynb`; progress streams to the
terminal while it runs. `inline`: the loop in the driving process, without the notebook (not listed among the lab's
machines: a run registered for it goes there by name)."""
from __future__ import annotations

import functools
import signal
import sys
from pathlib import Path
from typing import Callable

from lab.config import card_set
from lab.kernel.checkpoint import checkpoint_step, list_checkpoints
from lab.kernel.metrics import METRICS_MARK
from lab.machines.auto import Machine
from lab.machines.base import Follow, Host
from lab.machines.control import set_control, tail
from lab.machines.ending import Facts, Said, ended
from lab.machines.handoff import SessionOutputs, read_outputs
from lab.machines.lifecycle import Away
from lab.machines.remote.half import smi
from lab.notebooks import write_link_notebook
from lab.procs import forwarding_stop_signals, signal_session
from lab.runs import End, Link, Outcome, Run, now, updating
from lab.spec import LinkSpec


@functools.cache
def local_cards() -> list[str]:
    """nvidia-smi's "name, memory" line for each card of this computer, asked once (without torch)."""
    return smi("--query-gpu=name,memory.total", timeout_s=10)


def local_gpu() -> str:
    cards = local_cards()
    return card_set(cards[0].split(",")[0], len(cards)) if cards else "cpu"


class LocalHost(Host):
    """This computer: the notebook runs inside the driver's process, so the session lives as long as it."""
    kind = "local"
    one_link_per_start = True
    session_in_driver = True
    keeps_notebook = True  # its link's notebook is kept as executed here

    def __init__(self, name: str | None = None):
        super().__init__(name or self.kind)  # this computer is called by its kind: local, inline

    @classmethod
    def names(cls) -> list[str]:
        return [cls.kind]

    def state(self, running: list[str], patient: bool = False) -> Machine:
        return Machine(self.name, "local", self.cards(), running=running, free=not running)

    def cards(self) -> str | None:
        return local_gpu()

    def start(self, run: Run, machine: Machine, why: str) -> Link:
        with updating(run.id) as r:
            link = Link(n=len(r.links) + 1, machine=self.name, kind=self.kind, status="running", from_step=r.step)
            link.notebook = f"links/{link.n:03d}-{self.name}.ipynb" if self.keeps_notebook else None
            r.links.append(link)
            r.status = "running"
        return link

    def follow(self, run: Run, link: Link, how: Follow) -> Link:
        if not how.fresh:
            return _abandon(run, link, how.say)
        forked = Path(run.parent["checkpoint"]) if run.parent and run.parent.get("checkpoint") else None
        resume = run.folder if list_checkpoints(run.folder / "checkpoints") else forked
        set_control(run.id, message="running on this computer", message_ru="идёт на этом компьютере",
                    waiting_until=None)
        return execute_link(run, link, Path(run.cfg.data_dir), resume, progress=how.progress, nproc=how.nproc,
                            cancelled=how.cancelled)

    def cancel(self, run: Run, link: Link, driver_pid: int | None) -> str:
        if driver_pid:
            # To the notebook's kernel (and torchrun's workers), not the driver: the loop's saver
            # catches it, saves a checkpoint and stops cleanly, and the driver records the link.
            # Only this run's: the driver may be a notebook's kernel that started other runs.
            signal_session(run.folder, signal.SIGINT, pid=driver_pid)
        return f"run {run.id}: the session on this computer saves a checkpoint and stops"

    def log_tail(self, run: Run, link: Link, lines: int) -> str:
        return tail(run.folder / "driver.log", lines) or tail(run.folder / "control.log", lines)


def _abandon(run: Run, link: Link, say) -> Link:
    found = list_checkpoints(run.folder / "checkpoints")
    step = checkpoint_step(found[-1]) if found else None
    with updating(run.id) as r:
        last = r.links[link.n - 1]
        last.status, last.ended = "failed", now()
        last.reason = "the control process stopped while it ran"
        # The run goes on: nothing of the session's own failed.
        last.outcome = Outcome(End.INTERRUPTED, last.reason, "управляющий процесс остановился, пока сессия шла")
        last.to_step = step if step and step > last.from_step else None
    say(f"link {link.n} on this computer: {last.reason}; the run goes on from step {step or 0}")
    return last


def execute_link(run: Run, link: Link, data_dir: Path, resume: Path | None, *, progress: bool = True,
                 nproc: int = 0, cancelled: Callable[[], bool] = lambda: False) -> Link:
    """Runs the session of `link` here and records how it ended (lab.machines.ending); the ended link."""
    import papermill as pm  # papermill: only where a session runs here

    out_nb = run.folder / link.notebook
    spec = LinkSpec.of(run.cfg, data_dir=str(data_dir), out_dir=str(run.folder), resume_from=str(resume) if resume
                       else "", nproc=nproc, plot_every_s=30)
    sent = write_link_notebook(spec, out_nb.with_name(f"{out_nb.stem}.sent.ipynb"))  # the link's spec, once
    (run.folder / "result.json").unlink(missing_ok=True)  # the previous link's
    error = None
    try:
        # The kernel's own lines (the loop's progress) stream to this terminal; its machine lines stay in the files.
        streams = {"stdout_file": HumanLines(sys.stdout), "stderr_file": HumanLines(sys.stderr)} if progress else {}
        with forwarding_stop_signals(run.folder, say=lambda m: print(m, file=sys.stderr, flush=True)):
            pm.execute_notebook(str(sent), str(out_nb), cwd=str(run.folder), progress_bar=False, kernel_name="python3",
                                extra_arguments=QUIET_KERNEL, **streams)
    except pm.PapermillExecutionError as e:
        error = f"{e.ename}: {e.evalue}"
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as e:  # noqa: BLE001 - a dead kernel, no kernelspec: the link is recorded failed
        error = f"{type(e).__name__}: {e}"
    out = read_outputs(run.folder)
    end = ended(facts_here(link, out, error, cancelled(), out_nb))
    with updating(run.id) as r:
        link = r.links[link.n - 1]
        end.put(link, out)
        Away.put(link, spec=spec.to_dict())  # what it was sent, as every kind records it
        r.status = link.status
    return link


def facts_here(link: Link, out: SessionOutputs, error: str | None, cancel_asked: bool, notebook: Path) -> Facts:
    return Facts(where="this computer", said=Said.EXITED, out=out, from_step=link.from_step, error=error,
                 cancel_asked=cancel_asked, hint=f"The executed notebook is {notebook}.")


# The kernel's own start-up warnings ("running over TCP without encryption") go straight to this
# terminal, past papermill's streams: the kernel is told to say only its errors.
QUIET_KERNEL = ["--IPKernelApp.log_level=ERROR"]


class HumanLines:
    """The session's output on this terminal, in whole lines, without the machine's own (kept in the files)."""
    MACHINE = (METRICS_MARK, "[IPKernelApp]", "Kernel is running over TCP")

    def __init__(self, stream):
        self.stream, self.partial = stream, ""

    def write(self, text: str) -> int:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            if not any(mark in line for mark in self.MACHINE):
                self.stream.write(line + "\n")
        self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


STOP_FILE = "inline-stop"  # in the run folder: the loop stops at its next step boundary, saving first


class InlineHost(LocalHost):
    """This computer in the driving process itself: the training loop without the notebook (the path `lab train`
    takes), so a tiny CPU sweep (`lab sweep --inline`) starts no kernel per run."""
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
            end.put(last, out)
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
