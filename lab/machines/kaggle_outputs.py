"""What a Kaggle session leaves: its outputs downloaded, checked, and merged into the run folder
so the curve reads as one line across links and the newest checkpoints are kept."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from lab.faults import reached
from lab.kernel.checkpoint import INPUT_NOT_READY, checkpoint_meta, list_checkpoints, place_checkpoint, verify_checkpoint
from lab.kernel.metrics import metrics_lines, write_metrics_lines
from lab.machines.kaggle_data import LinkContext, get_link, put, set_link
from lab.machines.outcome import End, Outcome
from lab.runs import Link, now, updating


def download(run_id: str, n: int, ctx: LinkContext) -> dict:
    """The session's outputs into the link's folder, checked; not redone once done."""
    c, say = ctx.c, ctx.say
    run, link = get_link(run_id, n)
    output = link.detail.get("output") or {}
    if output.get("done"):
        return output  # a finished download is not redone
    folder = run.folder / link.detail["folder"]
    slug = link.detail["kernel"]["slug"]
    for _ in range(2):  # one more download when the first came incomplete
        files = c.kernel_output(slug, folder)
        check = check_output(folder)
        if not check.get("problem"):
            break
        say(f"link {n}: {check['problem']}; downloading again")
    reached("after-download")
    output = {"done": True, "files": sorted(str(Path(f).relative_to(folder)) for f in files),
              "downloaded_at": now(), **check}
    set_link(run_id, n, output=output, phase="downloaded")
    say(f"link {n}: downloaded {len(files)} files into {folder}")
    return output


def check_output(folder: Path) -> dict:
    """The session's result and its newest whole checkpoint (sha256 recomputed here)."""
    out: dict = {}
    marker = folder / INPUT_NOT_READY
    if marker.is_file():  # the session stopped before training: its inputs were not the ones sent
        try:
            out["input_not_ready"] = json.loads(marker.read_text(encoding="utf-8"))
        except ValueError:
            out["input_not_ready"] = {"found": "unreadable marker"}
    result_path = folder / "result.json"
    if result_path.is_file():
        try:
            out["result"] = json.loads(result_path.read_text(encoding="utf-8"))
        except ValueError:
            out["problem"] = "result.json is unreadable"
    for path in reversed(list_checkpoints(folder / "checkpoints")):
        problem = verify_checkpoint(path)
        if problem is not None:
            out["problem"] = f"checkpoint {path.name}: {problem}"
            continue
        meta = checkpoint_meta(path)
        out["checkpoint"] = {"name": path.name, "step": int(meta["step"]), "sha256": meta["sha256"]}
        break
    named = (out.get("result") or {}).get("checkpoint")
    if named and (out.get("checkpoint") or {}).get("name") != Path(named).name:
        out["problem"] = f"the session's checkpoint {Path(named).name} is missing or corrupt in its output"
    return out


def finish(run_id: str, n: int, status: str, failure: str, say) -> Link:
    """Merges the link's outputs into the run folder and records how the link ended, with its
    outcome: went on from its checkpoint, pushed again (its inputs were not mounted yet), lost
    (only that session), or cancelled."""
    run, link = get_link(run_id, n)
    output = link.detail["output"]
    folder = run.folder / link.detail["folder"]
    ckpt, result = output.get("checkpoint"), output.get("result")
    if ckpt and ckpt["step"] >= link.from_step:
        merge_checkpoint(folder / "checkpoints" / ckpt["name"], run.folder)
    merge_metrics(run.folder, folder / "metrics.jsonl", link.from_step)
    for name in ("result.json", "config.json", "device.json"):
        if (folder / name).is_file():
            shutil.copyfile(folder / name, run.folder / name)
    if (run.folder / "metrics.jsonl").is_file():
        from lab.kernel.plots import save_loss_plot
        save_loss_plot(run.folder, title=run.id)
    with updating(run_id) as r:
        link = r.links[n - 1]
        link.ended = now()
        link.detail["phase"] = "merged"
        if ckpt:
            link.checkpoint = {"name": ckpt["name"], "step": ckpt["step"], "sha256": ckpt["sha256"]}
            link.to_step = ckpt["step"]
        if status == "CANCEL_ACKNOWLEDGED":
            link.status, link.reason = "cancelled", (result or {}).get("reason") or "cancelled on Kaggle"
            link.outcome = Outcome(End.CANCELLED, link.reason)
        elif output.get("input_not_ready"):
            wrong = ", ".join((output["input_not_ready"].get("expected") or {}).keys()) or "its inputs"
            link.status = "failed"
            link.reason = (f"the session did not find {wrong} as sent (Kaggle had not mounted the READY version "
                           "yet); it trained nothing, and the lab pushes again after a wait")
            link.outcome = Outcome(End.PUSH_AGAIN, link.reason,
                                   f"сессия не нашла {wrong} в том виде, в каком их отправили (Kaggle ещё не "
                                   "подключил готовую версию); она ничего не обучила, и лаба отправит её снова "
                                   "после паузы")
        elif result and not output.get("problem") and not result.get("failed"):
            link.to_step, link.reason = int(result["step"]), result["reason"]
            link.status = "done" if result.get("done") else "stopped"
            link.outcome = Outcome(End.CONTINUE, link.reason)
        elif ckpt and ckpt["step"] > link.from_step:
            # Killed, or ended in ERROR after a save: the link ended at its whole checkpoint.
            why = (result or {}).get("reason") if (result or {}).get("failed") else failure
            link.status = "stopped"
            link.reason = (f"the session ended {status}" + (f" ({why})" if why else "")
                           + f"; the run goes on from its checkpoint at step {ckpt['step']}")
            link.outcome = Outcome(End.CONTINUE, link.reason)
        else:
            link.status = "failed"
            failure = (result or {}).get("reason") if (result or {}).get("failed") else failure
            link.reason = failure_reason(link, status, failure, output)
            link.outcome = Outcome(End.LOST, link.reason)
    say(f"link {n}: {link.status} at step {link.to_step} ({link.reason})")
    return link


def failure_reason(link: Link, status: str, failure: str, output: dict) -> str:
    """Why a session gave no result, and what to do: for the run's message."""
    account, slug = link.machine, link.detail["kernel"]["slug"]
    why = output.get("problem") or f"the session ended {status}" + (f": {failure}" if failure else "")
    hint = ""
    if link.detail["kernel"].get("dropped_sources"):
        hint = (f" Kaggle ran it without {', '.join(link.detail['kernel']['dropped_sources'])}; the lab forgot "
                "them and uploads them again on the next try.")
    at = f" The run keeps its checkpoint at step {link.to_step}." if link.to_step else ""
    return (f"Kaggle account '{account}': {why}. The log is in {link.detail['folder']}/{slug.split('/')[1]}.log."
            f"{hint}{at} Fix the cause, then `lab watch RUN` continues the run.")


# ---------------------------------------------------------------------------------------------
# The run folder: one curve, the newest checkpoints


def merge_checkpoint(ckpt: Path, run_folder: Path) -> Path:
    """Puts a verified checkpoint into the run's `checkpoints/`, hard-linked where it can be."""
    return place_checkpoint(ckpt, run_folder / "checkpoints", put=put)


def merge_metrics(run_folder: Path, link_metrics: Path, from_step: int) -> None:
    """The run's rows up to the link's start, then the link's rows after it. Each link carries
    the earlier rows itself; taking the run's own keeps what an earlier link wrote exactly."""
    if not link_metrics.is_file():
        return
    mine = run_folder / "metrics.jsonl"
    early = metrics_lines(mine, upto=from_step) or metrics_lines(link_metrics, upto=from_step)
    write_metrics_lines(mine, early + metrics_lines(link_metrics, after=from_step))

