"""The "own card" machine: the training notebook executed here by papermill.

One link of a run: the notebook is parameterized with the run's fields, executed with the
run folder as its working directory (metrics, checkpoints and the plot land there), and
kept as `links/<n>-local.ipynb`. Progress streams to the terminal while it runs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from lab.config import RunConfig, UserError
from lab.kernel.checkpoint import checkpoint_meta, checkpoint_step, list_checkpoints
from lab.notebooks import TRAIN_NOTEBOOK, parameterized
from lab.procs import forwarding_stop_signals
from lab.runs import Link, Run, now, updating

NAME = "local"


def execute_link(run: Run, cfg: RunConfig, data_dir: Path, resume: Path | None, *,
                 progress: bool = True, nproc: int = 0) -> Link:
    """Runs one session of `run` here and records it; returns the finished link."""
    import papermill as pm

    with updating(run.id) as r:
        link = Link(n=len(r.links) + 1, machine=NAME, status="running", from_step=r.step)
        link.notebook = f"links/{link.n:03d}-{NAME}.ipynb"
        r.links.append(link)
        r.status = "running"
    out_nb = run.folder / link.notebook
    out_nb.parent.mkdir(exist_ok=True)
    cfg = RunConfig.from_dict({**cfg.to_dict(), "data_dir": str(data_dir),
                               "resume_from": str(resume) if resume else ""})
    params = parameterized(cfg, out_dir=str(run.folder), nproc=nproc, plot_every_s=30)
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
        link = r.links[-1]
        link.ended = now()
        if result and not error:
            link.to_step, link.reason = result["step"], result["reason"]
            link.status = "done" if result["done"] else "stopped"
            link.checkpoint = _checkpoint_meta(result.get("checkpoint"))
        else:
            link.status, link.reason = "failed", error or "the notebook wrote no result"
            link.to_step = _last_checkpoint_step(run.folder)
        r.status = link.status
    if error:
        raise UserError(f"run {run.id} failed: {error}. The executed notebook is {out_nb}; "
                        f"`lab watch {run.id}` continues it from the last checkpoint")
    return link


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
