"""What a Kaggle session leaves: its outputs downloaded, checked, and merged into the run folder
so the curve reads as one line across links and the newest checkpoints are kept; how the link
ended, as its outcome; and what the session measured (lab.machines.kaggle.sessions).

How a session ended is read from what it left, not from its status alone: Kaggle ends a session
at its runtime limit as CANCEL_ACKNOWLEDGED (two projects' notes, one with no outputs, log or
reason), so that status means "cancelled" only when the person asked (the link's
`cancel_requested`); otherwise it is a session that ended, going on from the checkpoint it
returned, or lost when none came back (the output listing may even answer 403 or 404 then).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from lab.faults import reached
from lab.kaggle.client import KaggleError
from lab.kaggle.limits import GPU_CHECKS_EN, GPU_CHECKS_RU
from lab.kaggle.probed import mark_cannot_run
from lab.kaggle.sessions import record_session
from lab.kernel.preflight import PREFLIGHT
from lab.machines.handoff import check_output, merge_link_outputs, read_marker
from lab.machines.kaggle.data import LinkContext
from lab.machines.kaggle.sessions import measure
from lab.machines.kaggle.record import KaggleLinkRecord
from lab.machines.kaggle.watch import patiently
from lab.machines.links import get_link
from lab.runs import End, Link, Outcome, now, updating

LISTING_TRIES = 3  # an output listing that answers 403/404 after the session ended is asked this often


def download(run_id: str, n: int, ctx: LinkContext) -> dict:
    """The session's outputs into the link's folder, checked; not redone once done."""
    c, say = ctx.c, ctx.say
    run, link = get_link(run_id, n)
    record = KaggleLinkRecord.of(link)
    output = record.output or {}
    if output.get("done"):
        return output  # a finished download is not redone
    folder = run.folder / record.folder
    slug = record.kernel.slug
    for _ in range(2):  # one more download when the first came incomplete
        files, refused = patiently(ctx, f"link {n}: downloading the outputs of {slug}",
                                   lambda: _listed_output(c, slug, folder, ctx.settings.poll_s))
        check = check_output(folder)
        if refused:
            check["problem"] = f"Kaggle answered {refused} when asked for the session's outputs: none came back"
            break
        if not check.get("problem"):
            break
        say(f"link {n}: {check['problem']}; downloading again")
    reached("after-download")
    output = {"done": True, "files": sorted(str(Path(f).relative_to(folder)) for f in files),
              "downloaded_at": now(), **check}
    KaggleLinkRecord.update(run_id, n, output=output, phase="downloaded")
    say(f"link {n}: downloaded {len(files)} files into {folder}")
    return output


def _listed_output(c, slug: str, folder: Path, poll_s: float) -> tuple[list, str | None]:
    """(the files downloaded, None), or ([], "HTTP 403") when the ended session's output listing
    keeps answering 403 or 404: its outputs are gone (a session Kaggle cut off may leave none)."""
    for attempt in range(LISTING_TRIES):
        try:
            return c.kernel_output(slug, folder), None
        except KaggleError as e:
            if e.status not in (403, 404):
                raise
            if attempt == LISTING_TRIES - 1:
                return [], f"HTTP {e.status}"
            time.sleep(poll_s)
    raise AssertionError("unreachable")


def finish(run_id: str, n: int, status: str, failure: str, say) -> Link:
    """Merges the link's outputs into the run folder and records how the link ended, with its
    outcome, and what the session measured."""
    run, link = get_link(run_id, n)
    record = KaggleLinkRecord.of(link)
    output = record.output or {}
    folder = run.folder / record.folder
    ckpt = output.get("checkpoint")
    _device_with_image(folder)
    merge_link_outputs(run.folder, run.id, folder, link.from_step, ckpt)
    with updating(run_id) as r:
        link = r.links[n - 1]
        link.ended = now()
        KaggleLinkRecord.put(link, phase="merged")
        if ckpt:
            link.checkpoint = {"name": ckpt["name"], "step": ckpt["step"], "sha256": ckpt["sha256"]}
            link.to_step = ckpt["step"]
        link.status, link.reason, link.outcome = _ending(link, status, failure, output)
        if link.status in ("done", "stopped"):
            link.to_step = int((output.get("result") or {}).get("step", link.to_step or 0))
        measured = measure(link, folder)
        KaggleLinkRecord.put(link, measured=measured)
    record_session(link.machine, run_id, link.n, link.ended, measured)
    if link.outcome.kind is End.UNFIT:
        mark_cannot_run(link.machine, link.reason, link.outcome.reason_ru or link.reason, f"run {run_id} link {n}")
    say(f"link {n}: {link.status} at step {link.to_step} ({link.reason})")
    return link


def _ending(link: Link, status: str, failure: str, output: dict) -> tuple[str, str, Outcome]:
    """(the link's status, its reason, its outcome) from what the session left."""
    ckpt, result = output.get("checkpoint"), output.get("result")
    if status == "CANCEL_ACKNOWLEDGED" and KaggleLinkRecord.of(link).cancel_requested:
        reason = (result or {}).get("reason") or "cancelled on Kaggle"
        return "cancelled", reason, Outcome(End.CANCELLED, reason)
    if output.get("no_gpu"):
        return ("failed", *_no_cards(link, output["no_gpu"]))
    if output.get("input_not_ready"):
        wrong = ", ".join((output["input_not_ready"].get("expected") or {}).keys()) or "its inputs"
        reason = (f"the session did not find {wrong} as sent (Kaggle had not mounted the READY version yet); it "
                  "trained nothing, and the lab pushes again after a wait")
        return "failed", reason, Outcome(End.PUSH_AGAIN, reason,
                                         f"сессия не нашла {wrong} в том виде, в каком их отправили (Kaggle ещё не "
                                         "подключил готовую версию); она ничего не обучила, и лаба отправит её снова "
                                         "после паузы")
    if result and not output.get("problem") and not result.get("failed"):
        reason, ru = _said_by_kaggle(result, status, failure)
        return ("done" if result.get("done") else "stopped"), reason, Outcome(End.CONTINUE, reason, ru)
    if ckpt and ckpt["step"] > link.from_step:
        # Cut off, killed, or ended in ERROR after a save: the link ended at its whole checkpoint.
        why = (result or {}).get("reason") if (result or {}).get("failed") else failure
        reason = (f"the session ended {status}" + (f" ({why})" if why else "") + _cut_off(status, result)
                  + f"; the run goes on from its checkpoint at step {ckpt['step']}")
        return "stopped", reason, Outcome(End.CONTINUE, reason)
    failure = (result or {}).get("reason") if (result or {}).get("failed") else failure
    reason = failure_reason(link, status, failure, output)
    return "failed", reason, Outcome(End.LOST, reason)


def _said_by_kaggle(result: dict, status: str, failure: str) -> tuple[str, str | None]:
    """The session's own end reason, or, for a SIGTERM the lab did not send (it never signals a
    Kaggle session), who sent it: Kaggle, at the session's runtime limit or the account's quota."""
    if result.get("reason") != "SIGTERM received":
        return result["reason"], None
    step, said = result.get("step"), f"{status}, SIGTERM" + (f": {failure}" if failure else "")
    return (f"Kaggle stopped the session ({said}): its runtime limit or the account's weekly quota ran out; "
            f"it saved at step {step}, and the run goes on from there",
            f"Kaggle остановил сессию ({said}): кончилось её время или недельная квота аккаунта; "
            f"она сохранилась на шаге {step}, и прогон продолжится оттуда")


def _cut_off(status: str, result: dict | None) -> str:
    """What a status says of a session that left no result of its own."""
    if status == "CANCEL_ACKNOWLEDGED" and not result:
        return " without being asked: Kaggle's own stop, at its runtime limit most likely"
    return ""


def _no_cards(link: Link, found: dict) -> tuple[str, Outcome]:
    """A session that came without the cards it was pushed for: why, and what the person does."""
    account = link.machine
    got = ", ".join(f"{c.get('name')} (compute capability {c.get('capability')})" for c in found.get("found") or [])
    en = (f"Kaggle account '{account}' ran link {link.n}'s session without the cards it was pushed for "
          f"({found.get('expected')}; it found {got or 'no CUDA device'}), so it stopped before training. "
          f"{GPU_CHECKS_EN}. The lab marks '{account}' as unable to run GPU sessions (`lab accounts` shows it); once "
          f"verified, `lab probe {account}`")
    ru = (f"аккаунт Kaggle '{account}' запустил сессию звена {link.n} без карт, для которых её отправили "
          f"({found.get('expected')}; нашлось: {got or 'ни одного устройства CUDA'}), и она остановилась до обучения. "
          f"{GPU_CHECKS_RU}. Лаба отмечает '{account}' как не способный запускать сессии GPU; после подтверждения — "
          f"`lab probe {account}`")
    return en, Outcome(End.UNFIT, en, ru)


def _device_with_image(folder: Path) -> None:
    """The link's device.json with what the session's start found: the image it ran (Kaggle's
    image version files, Python, torch, CUDA, the driver) and the cards."""
    start = read_marker(folder / PREFLIGHT)
    if not start:
        return
    device = read_marker(folder / "device.json") or {}
    device.update(image=start.get("image"), cards_found=start.get("found"))
    (folder / "device.json").write_text(json.dumps(device, indent=1), encoding="utf-8")


def failure_reason(link: Link, status: str, failure: str, output: dict) -> str:
    """Why a session gave no result, and what to do: for the run's message."""
    record = KaggleLinkRecord.of(link)
    account, kernel = link.machine, record.kernel
    ended = f"the session ended {status}" + (f": {failure}" if failure else "") + _cut_off(status, output.get("result"))
    why = f"{ended}; {output['problem']}" if output.get("problem") else ended
    hint = ""
    if kernel.dropped_sources:
        hint = (f" Kaggle ran it without {', '.join(kernel.dropped_sources)}; the lab forgot "
                "them and uploads them again on the next try.")
    at = f" The run keeps its checkpoint at step {link.to_step}." if link.to_step else ""
    return (f"Kaggle account '{account}': {why}. The log is in {record.folder}/{kernel.name}.log."
            f"{hint}{at} Fix the cause, then `lab watch RUN` continues the run.")
