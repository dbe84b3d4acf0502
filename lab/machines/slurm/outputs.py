"""What a link's job leaves: its outputs brought back into the link's folder here (metrics,
result, plot, executed notebook, the job's log, and the checkpoint the run goes on from, its
sha256 checked against its sidecar), merged into the run folder as a box's are (one curve across
links and machines), the link's outcome from how Slurm says the job ended, and the link's folder
on the cluster removed once its outputs are merged (the cluster's scratch space keeps the data,
shared by the runs, and nothing a finished link no longer needs).

How the job ended, as the kit's outcomes: a session that saved and stopped (its limit, Slurm's
signal before the job's time limit, done) goes on from its checkpoint; a time limit (TIMEOUT), a
preemption or a requeue (PREEMPTED, requeued) or a node that failed (NODE_FAIL) go on from the
checkpoint the session saved at Slurm's SIGTERM, and lose only that job when there is none; a
cancel the person asked for (`lab cancel`) is a cancel, one the lab did not ask for (scancel by
hand, the cluster's admins) stops the run and says so; OUT_OF_MEMORY and a failed job stop the
run with the end of the job's log.
"""
from __future__ import annotations

from pathlib import Path

from lab.config import UserError
from lab.corpus.manifests import data_id_of
from lab.machines.handoff import check_output, merge_link_outputs
from lab.runs import End, Outcome
from lab.machines.slurm.job import SlurmLink, note, record
from lab.machines.slurm.stage import SlurmCtx
from lab.machines.ssh.boxes import note_data
from lab.runs import Link, now, updating

LOG_LINES = 4  # of the job's log in a failure's reason


def collect(ctx: SlurmCtx) -> dict:
    """The job's outputs (its first node's) into the link's folder, checked; not done again."""
    _, _, rec = record(ctx.run_id, ctx.n)
    if (rec.output or {}).get("done"):
        return rec.output
    folder, check, listing = ctx.folder, {}, {"out": {}, "link": {}}
    for attempt in range(2):  # once more when the first copy came incomplete
        listing = ctx.login.helper("outputs", rec.remote)
        ckpt = listing["checkpoint"]
        wanted = {rel: size for rel, size in listing["out"].items() if not rel.startswith("checkpoints/")
                  or ckpt and rel in (f"checkpoints/{ckpt}", f"checkpoints/{ckpt[:-3]}.json")}
        ctx.login.copy_down(f"{rec.remote}/out", wanted, folder, rec.rsync)
        ctx.login.copy_down(rec.remote, listing["link"], folder, rec.rsync)
        check = check_output(folder)
        if not check.get("problem"):
            break
        ctx.say(f"link {ctx.n}: {check['problem']}; copying it again")
        for rel in wanted:
            if rel.startswith("checkpoints/"):
                (folder / rel).unlink(missing_ok=True)
    output = {"done": True, "collected_at": now(), "exit": listing.get("exit"), **check}
    note(ctx.run_id, ctx.n, output=output, phase="collected")
    ctx.say(f"link {ctx.n}: brought back {len(listing['out']) + len(listing['link'])} files into {folder}")
    return output


def finish(ctx: SlurmCtx, output: dict) -> Link:
    """Merges the link's outputs into the run folder and records how the link ended."""
    run, link, rec = record(ctx.run_id, ctx.n)
    folder = ctx.folder
    ckpt = output.get("checkpoint")
    merge_link_outputs(run.folder, run.id, folder, link.from_step, ckpt)
    if output.get("input_not_ready"):  # the cluster holds other data than sent: copied again next time
        note_data(ctx.cluster.name, 0, data_id_of(Path(run.cfg.data_dir)), held=False)
    log = (folder / "session.log").read_text(encoding="utf-8", errors="replace")[-8000:] \
        if (folder / "session.log").is_file() else ""
    status, reason, outcome = ending(rec, link.from_step, output, ctx.cancelled(), ctx.cluster.where, log)
    cleaned = outcome.kind is not End.FAILED and clean(ctx, rec)  # a failed job's folder stays for a look there
    with updating(ctx.run_id) as r:
        link = r.links[ctx.n - 1]
        link.ended, link.status, link.reason, link.outcome = now(), status, reason, outcome
        rec = SlurmLink.from_dict(link.detail)
        rec.phase, rec.cleaned = "merged", cleaned
        link.detail = rec.to_dict()
        if (folder / "executed.ipynb").is_file():
            link.notebook = f"{rec.folder}/executed.ipynb"
        if ckpt:
            link.checkpoint = {"name": ckpt["name"], "step": ckpt["step"], "sha256": ckpt["sha256"]}
            link.to_step = ckpt["step"]
        if output.get("result") and status in ("done", "stopped", "cancelled"):
            link.to_step = int(output["result"]["step"])
        r.status = link.status
    ctx.say(f"link {ctx.n}: {link.status} at step {link.to_step} ({link.reason})")
    return link


def ending(rec: SlurmLink, from_step: int, output: dict, cancelled: bool, where: str,
           log: str = "") -> tuple[str, str, Outcome]:
    """(the link's status, its reason, its outcome) from Slurm's last word on the job, the
    session's markers, what came back and the end of the job's log. Pure."""
    state = (rec.state or {}).get("state") or ("PREEMPTED" if rec.preempted else "UNKNOWN")
    if rec.preempted:
        state = "PREEMPTED"
    result, ckpt = output.get("result"), output.get("checkpoint")
    ended = (rec.last or {}).get("exit") or output.get("exit") or {}
    job = f"job {rec.job}"
    if rec.pending and rec.pending.get("never"):
        return "failed", f"{rec.pending['en']}; it was scancelled. Fix the cluster's settings (`lab machines add`)", \
            Outcome(End.FAILED, f"{rec.pending['en']}; it was scancelled", rec.pending["ru"], session=False)
    if output.get("input_not_ready"):
        why = f"{where}: {job} did not find the data or the checkpoint as sent; the lab copies them again"
        return "failed", why, Outcome(End.LOST, why)
    saved = bool(result) and not output.get("problem") and not result.get("failed") and ended.get("ok", True)
    if saved:
        return _saved(state, rec, result, cancelled, job)
    went_on = bool(ckpt) and ckpt["step"] > from_step
    return _cut(state, rec, output, ended, went_on, cancelled, where, job, log)


def _saved(state: str, rec: SlurmLink, result: dict, cancelled: bool, job: str) -> tuple[str, str, Outcome]:
    """The session saved and stopped: at its limit, at Slurm's signal, at a cancel, or done."""
    reason = str(result["reason"])
    if rec.preempted or state == "PREEMPTED":
        reason = f"{job} was preempted (Slurm requeued it): saved at step {result['step']} at Slurm's signal"
    elif state == "TIMEOUT":
        reason = f"{job} reached its time limit ({rec.minutes} min) after saving at step {result['step']} ({reason})"
    elif "SIGTERM" in reason and not cancelled and not result.get("done"):
        reason = f"{job} neared its time limit ({rec.minutes} min): saved at step {result['step']} at Slurm's signal"
    if result.get("done"):
        return "done", reason, Outcome(End.CONTINUE, reason)
    if cancelled:
        reason = f"{job} cancelled with lab cancel: saved at step {result['step']}"
        return "cancelled", reason, Outcome(End.CANCELLED, reason)
    return "stopped", reason, Outcome(End.CONTINUE, reason)


def _cut(state: str, rec: SlurmLink, output: dict, ended: dict, went_on: bool, cancelled: bool, where: str,
         job: str, log_text: str) -> tuple[str, str, Outcome]:
    """The session did not end on its own: what Slurm says, and whether a checkpoint came back."""
    step = (output.get("checkpoint") or {}).get("step")
    on = f"; the run goes on from its checkpoint at step {step}" if went_on else ""
    cut = {"TIMEOUT": f"{job} reached its time limit ({rec.minutes} min)",
           "PREEMPTED": f"{job} was preempted (Slurm requeued it)",
           "NODE_FAIL": f"{job} lost its node (NODE_FAIL)", "BOOT_FAIL": f"{job}'s node failed to boot (BOOT_FAIL)",
           "UNKNOWN": f"Slurm no longer knows {job} (it ended more than its MinJobAge ago, and the cluster keeps no "
                      "accounting), and it left no result"}
    if state in cut:
        reason = f"{where}: {cut[state]}{on or '; no checkpoint of it came back: only that job is lost'}"
        return ("stopped", reason, Outcome(End.CONTINUE, reason)) if went_on else \
            ("failed", reason, Outcome(End.LOST, reason))
    if state == "CANCELLED" and cancelled:
        reason = f"{job} cancelled with lab cancel" + (f" after saving at step {step}" if went_on else "")
        return "cancelled", reason, Outcome(End.CANCELLED, reason)
    log = _log_end(log_text)
    if state == "CANCELLED":
        reason = (f"{where}: {job} was cancelled outside the lab (scancel by hand, or the cluster's admins){on}. "
                  "The run stops here; `lab watch RUN` continues it")
        return "failed", reason, Outcome(End.FAILED, reason, f"{where}: задача {rec.job} отменена не лабой "
                                                             "(scancel вручную или администраторами кластера). Прогон "
                                                             "остановлен; `lab watch RUN` продолжит его")
    if state == "OUT_OF_MEMORY":
        why = (f"{job} ran out of memory (OUT_OF_MEMORY): give it a smaller batch_per_card, or ask the cluster for "
               "more memory")
    else:
        error = ended.get("error") or output.get("problem") or "no result"
        why = f"{job}'s session failed: {error}" if state == "COMPLETED" else f"{job} failed ({state}): {error}"
        if "ModuleNotFoundError" in error:
            why += " (the cluster's Python lacks it: `lab machines check` on the cluster lists what to install)"
    if went_on:
        reason = f"{where}: {why}{on}"
        return "stopped", reason, Outcome(End.CONTINUE, reason)
    reason = (f"{where}: {why}.{log} The job's log and notebook are in {rec.folder}/; fix the cause, then "
              "`lab watch RUN` continues the run")
    return "failed", reason, Outcome(End.FAILED, reason, f"{where}: задача {rec.job} упала: {why}.{log} Журнал и "
                                                        f"блокнот в {rec.folder}/; исправьте причину, затем "
                                                        "`lab watch RUN` продолжит прогон")


def _log_end(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Executing")]
    return f" Its log ends: {' | '.join(lines[-LOG_LINES:])}." if lines else ""


def clean(ctx: SlurmCtx, rec: SlurmLink) -> bool:
    """Removes the link's folder on the cluster once its outputs are merged here: nothing there is
    needed any more (the next link stages its own checkpoint); the data stays for the runs that
    share it. Whether it was removed (a login node out of reach leaves it, and says so)."""
    mine = f"/runs/{ctx.run_id}/{ctx.n:03d}"
    if not rec.remote or not rec.remote.endswith(mine):
        return False
    try:
        ctx.login.remove(rec.remote, rec.remote[:-len(mine)])  # and the run's folder there, once empty
    except UserError as e:  # SshError too: the run's outputs are here already
        ctx.say(f"link {ctx.n}: could not remove {rec.remote} on {ctx.cluster.where} ({e}); it is no longer needed")
        return False
    return True
