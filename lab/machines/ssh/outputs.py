"""What a session on an SSH machine leaves: its outputs brought back into the link's folder
(`runs/<id>/links/<n>-<machine>/`: metrics, result, plot, executed notebook, the session's log,
and the checkpoint the run goes on from, its sha256 checked against its sidecar), merged into the
run folder as a Kaggle session's are (lab.machines.kaggle.outputs: one curve across links, the
newest checkpoints), and the link's outcome.
"""
from __future__ import annotations

from pathlib import Path

from lab.corpus.manifests import data_id_of
from lab.kernel.schedule import decay_start_for_config
from lab.machines.handoff import check_output, merge_link_outputs
from lab.machines.links import get_link
from lab.machines.ssh.record import BoxLinkRecord
from lab.machines.ssh.boxes import note_data
from lab.machines.ssh.client import copy_down
from lab.machines.ssh.link import BoxLink, remote
from lab.runs import End, Link, Outcome, now, updating



def collect(ctx: BoxLink, hosts: list[dict]) -> dict:
    """The session's outputs from the first host (its rank 0 wrote them) into the link's folder,
    the other hosts' logs beside them; checked, and not done again once done."""
    _, link = get_link(ctx.run_id, ctx.n)
    if (BoxLinkRecord.of(link).output or {}).get("done"):
        return BoxLinkRecord.of(link).output
    folder, first, address = ctx.folder, hosts[0], ctx.box.hosts[0]
    for attempt in range(2):  # once more when the first copy came incomplete
        listing = remote(ctx.box, 0, "outputs", first["link"])
        keep = [name for name in (listing["checkpoint"], _pre_decay(listing["out"], ctx)) if name]
        wanted = {rel: size for rel, size in listing["out"].items() if not rel.startswith("checkpoints/")
                  or any(rel in (f"checkpoints/{c}", f"checkpoints/{c[:-3]}.json") for c in keep)}
        copy_down(address, f"{first['link']}/out", wanted, folder, first["rsync"])
        copy_down(address, first["link"], listing["link"], folder, first["rsync"])
        check = check_output(folder)
        if not check.get("problem"):
            break
        ctx.say(f"link {ctx.n}: {check['problem']}; copying it again")
        for rel in wanted:
            if rel.startswith("checkpoints/"):
                (folder / rel).unlink(missing_ok=True)
    for i, host in enumerate(hosts[1:], start=1):  # their logs, for when something went wrong there
        copy_down(ctx.box.hosts[i], host["link"], {"session.log": None}, folder / f"node-{i}", host["rsync"])
    output = {"done": True, "collected_at": now(), "exit": listing.get("exit"), **check}
    BoxLinkRecord.update(ctx.run_id, ctx.n, output=output, phase="collected")
    ctx.say(f"link {ctx.n}: brought back {len(wanted) + len(listing['link'])} files into {folder}")
    return output


def _pre_decay(listed: dict, ctx: BoxLink) -> str | None:
    """The session's checkpoint where the run's decay began, if it saved one (a finished run grows
    from there: lab.settle.grow)."""
    start = decay_start_for_config(get_link(ctx.run_id, ctx.n)[0].cfg)
    names = sorted(rel.split("/", 1)[1] for rel in listed
                   if rel.startswith("checkpoints/ckpt_") and rel.endswith(".pt"))
    before = [n for n in names if start is not None and int(n[5:-3]) <= start]
    return before[-1] if before else None


def finish(ctx: BoxLink, last: dict, output: dict) -> Link:
    """Merges the link's outputs into the run folder and records how the link ended."""
    run, link = get_link(ctx.run_id, ctx.n)
    folder = ctx.folder
    ckpt = output.get("checkpoint")
    merge_link_outputs(run.folder, run.id, folder, link.from_step, ckpt)
    if output.get("input_not_ready"):  # the box holds other data than it was sent: copy it again next time
        for i in range(len(ctx.box.hosts)):
            note_data(ctx.box.name, i, data_id_of(Path(run.cfg.data_dir)), held=False)
    with updating(ctx.run_id) as r:
        link = r.links[ctx.n - 1]
        link.ended = now()
        BoxLinkRecord.put(link, phase="merged")
        if (folder / "executed.ipynb").is_file():
            link.notebook = f"{BoxLinkRecord.of(link).folder}/executed.ipynb"
        if ckpt:
            link.checkpoint = {"name": ckpt["name"], "step": ckpt["step"], "sha256": ckpt["sha256"]}
            link.to_step = ckpt["step"]
        _outcome(ctx, link, last, output)
        r.status = link.status
    ctx.say(f"link {ctx.n}: {link.status} at step {link.to_step} ({link.reason})")
    return link


def _outcome(ctx: BoxLink, link: Link, last: dict, output: dict) -> None:
    """The link's status, reason and outcome from what the box said and what came back."""
    where, ckpt, result = ctx.box.where, output.get("checkpoint"), output.get("result")
    ended = last.get("exit") or output.get("exit") or {}
    log = f"{BoxLinkRecord.of(link).folder}/session.log"
    if result and not output.get("problem") and not result.get("failed") and ended.get("ok", True):
        link.to_step, link.reason = int(result["step"]), result["reason"]
        link.status = "done" if result.get("done") else "stopped"
        cancelled = ctx.cancelled() and not result.get("done")
        link.outcome = Outcome(End.CANCELLED if cancelled else End.CONTINUE, link.reason)
        if cancelled:
            link.status = "cancelled"
        return
    if output.get("input_not_ready"):
        link.status, link.reason = "failed", (f"{where}: the session did not find the data or the checkpoint as "
                                              "sent; the lab copies them again for the next link")
        link.outcome = Outcome(End.LOST, link.reason)
        return
    why = ended.get("error") or (result or {}).get("reason") or output.get("problem") or {
        "died": "the session's process is gone without a word (the box rebooted, or it was killed)",
        "never": "the session never started there"}.get(last.get("phase"), "the session wrote no result")
    if ckpt and ckpt["step"] > link.from_step:
        link.status = "stopped"
        link.reason = f"{where}: {why}; the run goes on from its checkpoint at step {ckpt['step']}"
        link.outcome = Outcome(End.CONTINUE, link.reason)
        return
    link.status = "failed"
    if last.get("phase") in ("died", "never"):
        link.reason = f"{where}: {why}. Only that session is lost; its log is {log}."
        link.outcome = Outcome(End.LOST, link.reason)
        return
    folder = BoxLinkRecord.of(link).folder
    link.reason = (f"{where}: the session failed: {why}. The executed notebook and the log are in "
                   f"{folder}/; fix the cause, then `lab watch RUN` continues the run")
    link.outcome = Outcome(End.FAILED, link.reason,
                           f"{where}: сессия упала: {why}. Выполненный блокнот и журнал в {folder}/; "
                           "исправьте причину, затем `lab watch RUN` продолжит прогон")
