"""What the control notebook asks of the lab, in one place: `lab.machines` (the machines,
the Auto rule, starting and watching runs) plus what the form lists (constellations with
their token counts, accounts, checkpoints). Nothing here holds or returns a secret.

The machines' overview asks Kaggle for every account's quota, so it is kept until the
machines panel's Refresh: the form asks the Auto rule on every change, over this copy.
"""
from __future__ import annotations

import os
import threading

from lab import sizing
from lab.config import RunConfig, UserError, fields_off_defaults
from lab.corpus.manifests import train_tokens_by_constellation
from lab.machines import driver as machines
from lab.machines.control import spawn_driver
from lab.settle import register_run

Machine, Choice = machines.Machine, machines.Choice

_overview: list | None = None
_gpu: tuple[str, str] | None = None


def local_gpu() -> tuple[str, str]:
    """(this computer's card as `lab.sizing.CARDS` names it, or "" when the calculator has no
    figures for it; the card's own name and memory, for people)."""
    global _gpu
    if _gpu is None:
        card = machines.local_gpu()
        card = card if card in sizing.CARDS else ""
        _gpu = (card, _describe_gpu())
    return _gpu


def _describe_gpu() -> str:
    cards = machines.local_cards()
    if cards:
        return (f"{len(cards)}× " if len(cards) > 1 else "") + cards[0]
    return f"CPU ({os.cpu_count() or 1})"


def overview(refresh: bool = False) -> list:
    """This computer and every Kaggle account (`lab.machines.overview`), asked once and kept."""
    global _overview
    if refresh or _overview is None:
        _overview = machines.overview()
        _holds.clear()
    return _overview


_holds: dict[tuple, dict[str, set[str]]] = {}  # (data folder, constellations) -> what each account holds


def choose(cfg: RunConfig, need_hours: float | None) -> Choice:
    """The Auto rule over the kept overview, with what each account already holds asked the
    way the run's driver asks it (`lab.machines.holdings`): no call to Kaggle per keystroke."""
    found = overview()
    key = (cfg.data_dir, tuple(cfg.constellations))
    if key not in _holds:
        _holds[key] = machines.holdings(found, cfg)
    return machines.choose(cfg, need_hours, machines=found, holds=_holds[key])


def start(cfg: RunConfig, machine: str = "auto", resume: str | None = None) -> str:
    """Registers the run the form describes and returns its id; a background process drives it.
    Given are the fields off their defaults: a new run from a checkpoint keeps the checkpoint's
    run in every other field."""
    global _overview
    run = register_run({name: getattr(cfg, name) for name in fields_off_defaults(cfg)}, resume, machine)
    spawn_driver(run.id)
    _overview = None  # the kept overview no longer says who is busy
    _holds.clear()
    return run.id


def status(run_id: str) -> dict:
    """{"status", "links", "log_tail", "message", "message_ru", ...} of a run."""
    return machines.status(run_id)


def in_background(fn, *args, on_done=None, on_error=None) -> threading.Thread:
    """Runs `fn(*args)` in a daemon thread; hands the result or the exception to the callbacks."""
    def work():
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001 - shown to the person by on_error
            if on_error:
                on_error(e)
            return
        if on_done:
            on_done(result)
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


class Latest:
    """Runs `fn(*args)` in one background thread; only the newest request's answer is kept."""

    def __init__(self, fn, done):
        self.fn, self.done = fn, done
        self.lock, self.idle = threading.Lock(), threading.Event()
        self.pending, self.thread = None, None
        self.idle.set()

    def submit(self, *args) -> None:
        with self.lock:
            self.pending = args
            self.idle.clear()
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True)
                self.thread.start()

    def _loop(self) -> None:
        while True:
            with self.lock:
                args, self.pending = self.pending, None
                if args is None:
                    self.thread = None
                    self.idle.set()
                    return
            try:
                result, error = self.fn(*args), None
            except Exception as e:  # noqa: BLE001 - handed to `done`
                result, error = None, e
            with self.lock:
                stale = self.pending is not None
            if not stale:
                self.done(args, result, error)

    def wait(self, timeout_s: float = 30.0) -> bool:
        return self.idle.wait(timeout_s)


# ---------------------------------------------------------------------------------------
# What the form lists


def constellation_tokens() -> dict[str, int]:
    """Train tokens per constellation, for the form's list (`lab.corpus.manifests`)."""
    return train_tokens_by_constellation()


def account_names() -> list[str]:
    try:
        from lab.kaggle import client as kaggle_client
        return [a.name for a in kaggle_client.list_accounts()]
    except UserError:
        return []


def checkpoints() -> dict[str, dict]:
    """Every checkpoint of the lab's runs, newest run first: path -> {step, config, path, run}."""
    from lab.kernel.checkpoint import list_checkpoints
    from lab.runs import list_runs
    out: dict[str, dict] = {}
    for run in sorted(list_runs(), key=lambda r: (r.created, r.id), reverse=True):
        for pt in reversed(list_checkpoints(run.folder / "checkpoints")):
            info = sizing.checkpoint_info(str(pt))
            if info:
                out[info["path"]] = {**info, "run": run.id}
    return out
