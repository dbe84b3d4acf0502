"""The lab's machines: this computer, each Kaggle account, each box (or group of boxes) over SSH.

    overview(patient, only)           every machine with its state (quota, cards, what runs there)
    View                              an overview kept until stale (asked anew, forgotten, STALE_S
                                      old), with the Auto rule's pick over it: the form asks on
                                      every change, Kaggle once
    check(name, say)                  a machine's own check (a box's first one runs its whole check)
    add_box / add_cluster             the lab's own boxes over SSH, its Slurm clusters
    remove_box / check_box            either, by its kind; box_record(name) its last check
    local_gpu(), machine_cards(name)  the cards a run gets here, or on a named machine
    machine_choices(accounts)         what the form's and the runs panel's machine lists offer
    rows(machines)                    each machine as the faces show it: its words, its actions (a MachineRow)
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from lab.api.accounts import first_run_hint
from lab.config import RunConfig, UserError
from lab.kaggle.probed import age
from lab.machines import driver
from lab.machines.auto import Choice, Machine, choose
from lab.machines.control import active_runs
from lab.machines.local import local_cards
from lab.machines.local import local_gpu as local_card_set
from lab.machines.registry import host_for, kind_of, machine_names
from lab.machines.slurm import cluster as clusters
from lab.machines.slurm.check import check_cluster, partition_line
from lab.machines.remote.client import parse_hosts
from lab.machines.remote.store import check_problem, read_check
from lab.machines.ssh import boxes
from lab.machines.ssh.boxes import check_machine
from lab.sizing import card_for

__all__ = ["Choice", "Machine", "MachineRow", "View", "overview", "rows", "check", "add_box", "add_cluster", "remove_box", "check_box",
           "box_record", "box_age", "box_problem", "box_cards", "cluster_cards", "local_gpu", "machine_cards",
           "machine_choices", "partition_line"]


def overview(patient: bool = False, only: str | None = None) -> list[Machine]:
    """Every machine of the lab with its state, asked now (each Kaggle account's quota at once)."""
    return driver.overview(patient, only)


STALE_S = 300.0  # a kept overview older than this is asked anew: quota and sessions move on their own


class View:
    """The machines as a person looks at them: asked once and kept until it is stale — a refresh
    asked (the machines panel's Refresh, a probe ended), a change that makes it so (`forget`: a
    run started or ended, an account added or removed) or STALE_S since it was read — with what
    each already holds of a run asked the way the run's driver asks it, so the form's Auto
    preview makes no call to Kaggle per keystroke. `read_at` says when it was read."""

    def __init__(self) -> None:
        self._machines: list[Machine] | None = None
        self.read_at: float | None = None  # time.time() of the last overview
        self._forgotten = True
        self._holds: dict[tuple, dict[str, set[str]]] = {}

    def machines(self, refresh: bool = False) -> list[Machine]:
        """The machines, asked anew when `refresh` or stale."""
        if refresh or self.stale:
            found = overview()
            self._machines, self.read_at, self._forgotten = found, time.time(), False
            self._holds.clear()
        return self._machines

    @property
    def stale(self) -> bool:
        return self._forgotten or self.read_at is None or time.time() - self.read_at > STALE_S

    def kept(self) -> list[Machine] | None:
        """What was read last, stale or not (no call to any service): shown with `read_at`."""
        return self._machines

    def forget(self) -> None:
        """The kept state no longer says who is busy (a run started, an account added): the next
        look asks anew."""
        self._forgotten = True
        self._holds.clear()

    def choose(self, cfg: RunConfig, need_hours: float | None) -> Choice:
        found = self.machines()
        key = (cfg.data_dir, tuple(cfg.constellations))
        if key not in self._holds:
            self._holds[key] = driver.holdings(found, cfg)
        return choose(cfg, need_hours, machines=found, holds=self._holds[key])


@dataclass(frozen=True)
class MachineRow:
    """One machine as the faces show it: its state, its words and what can be done to it, decided
    here by its kind so that neither face asks which kind a machine is."""
    state: Machine
    title: tuple[str, str]  # what it is, (English, Russian): "alice · Kaggle 2xT4", "rack · a box over SSH · …"
    quota: bool  # it has a GPU quota: a bar with what is left and when it refreshes (a Kaggle account)
    answers: bool  # it answers its check: said reachable, or why not (a box, a cluster)
    actions: tuple[str, ...]  # "probe" and "remove" (an account), "check" (a box, a cluster); none here
    account: bool  # one of the lab's Kaggle accounts
    hint: tuple[str, str] | None  # a word under it before its first run, (English, Russian)

    @property
    def name(self) -> str:
        return self.state.name


def rows(machines: list[Machine]) -> list[MachineRow]:
    """The machines' rows, in their order."""
    return [_row(m) for m in machines]


def _row(m: Machine) -> MachineRow:
    if m.kind == "local":
        cards = local_gpu()[1]
        return MachineRow(m, (f"This computer · {cards}", f"Этот компьютер · {cards}"), False, False, (), False, None)
    if m.kind == "kaggle":
        return MachineRow(m, (f"{m.name} · Kaggle {m.gpu}", f"{m.name} · Kaggle {m.gpu}"), True, False,
                          ("probe", "remove"), True, first_run_hint(m.name, m.has_ever_run))
    if m.kind == "slurm":
        what = ("a Slurm cluster", "кластер Slurm")
    elif m.hosts > 1:
        what = (f"a group of {m.hosts} boxes over SSH", f"группа из {m.hosts} машин по SSH")
    else:
        what = ("a box over SSH", "машина по SSH")
    gpu = f" · {m.gpu}" if m.gpu else ""
    return MachineRow(m, (f"{m.name} · {what[0]}{gpu}", f"{m.name} · {what[1]}{gpu}"), False, True, ("check",),
                      False, None)


def check(name: str, say: Callable[[str], None] = print) -> None:
    """Raises UserError when the machine cannot be used now; `say` is told what a long check does."""
    host_for(name).check(say)


_gpu: tuple[str, str] | None = None


def local_gpu() -> tuple[str, str]:
    """(this computer's card set as the calculator names it, or "" when it has no figures for it;
    the card's own name for people), asked once."""
    global _gpu
    if _gpu is None:
        card = local_card_set()
        cards = local_cards()
        who = ((f"{len(cards)}× " if len(cards) > 1 else "") + cards[0]) if cards else f"CPU ({os.cpu_count() or 1})"
        _gpu = (card if card_for(card) is not None else "", who)
    return _gpu


def box_cards() -> dict[str, str]:
    """The lab's boxes, each with the card set its check found ("" before a check)."""
    try:
        return {b.name: (read_check(b.name) or {}).get("gpu") or "" for b in boxes.Box.all()}
    except UserError:
        return {}


def cluster_cards() -> dict[str, str]:
    """The lab's Slurm clusters, each with the card set its check found ("" before a check)."""
    try:
        return {c.name: (read_check(c.name) or {}).get("gpu") or "" for c in clusters.Cluster.all()}
    except UserError:
        return {}


def machine_cards(machine: str) -> str:
    """The card set of the machine a run goes to, as its check or this computer found it ("" for
    Kaggle's, Auto's or an unchecked machine's)."""
    if machine == "local":
        return local_gpu()[0]
    if machine == "auto":
        return ""
    return (read_check(machine) or {}).get("gpu") or ""


def sized_cards(machine: str) -> str | None:
    """The card set of the machine a run goes to (`machine_cards`) where the calculator has figures
    for it; None: size for Kaggle's cards (Auto's, an unchecked machine's, cards it does not know)."""
    cards = machine_cards(machine)
    return cards if card_for(cards) is not None else None


def machine_choices(accounts: list[str], words: Callable[[str, str], str]) -> list[tuple[str, str]]:
    """The machines a run may be sent to, (label, name), labelled by `words(en, ru)`."""
    return ([(words("Auto", "Авто"), "auto"), (words("This computer", "Этот компьютер"), "local")]
            + [(f"Kaggle: {a}", a) for a in accounts]
            + [(f"{words('Box', 'Машина')}: {name}" + (f" ({gpu})" if gpu else ""), name)
               for name, gpu in box_cards().items()]
            + [(f"{words('Cluster', 'Кластер')}: {name}" + (f" ({gpu})" if gpu else ""), name)
               for name, gpu in cluster_cards().items()])


def add_box(name: str, ssh: str | None = None, hosts: str | None = None, port: int | None = None,
            python: str | None = None, workdir: str | None = None, *, check: bool = True,
            say: Callable[[str], None] = print) -> tuple[boxes.Box, dict | None]:
    """A box (`ssh`) or a group of boxes (`hosts`), stored and checked at once unless `check` is
    off; one that cannot be reached is not kept. Returns it with its check's record."""
    box = boxes.add_box(name, parse_hosts(ssh, hosts, port), python, workdir, taken=machine_names())
    if not check:
        return box, None
    try:
        return box, check_machine(box.name, say=say)
    except UserError as e:  # unreachable, a changed host key, no Python there: not worth keeping
        box.remove()
        text = str(e)
        raise UserError(text + (" " if text.endswith((".", "?")) else ". ") + "The machine was not added.") from None


def add_cluster(name: str, login: str, port: int | None = None, partition: str | None = None,
                account: str | None = None, gres: str | None = None, nodes: int | None = None,
                time: str | None = None, python: str | None = None, workdir: str | None = None, *,
                check: bool = True, say: Callable[[str], None] = print) -> tuple[clusters.Cluster, dict | None]:
    """A Slurm cluster by its login node (`local`: this computer is one), stored and checked at
    once (its partition, and a short measured job) unless `check` is off; one that fails its check
    is not kept. Returns it with its check's record."""
    shape = clusters.checked_shape(partition, account, gres, nodes, time)
    cluster = clusters.add_cluster(name, clusters.parse_login(login, port), shape, python, workdir,
                                   taken=machine_names())
    if not check:
        return cluster, None
    try:
        return cluster, check_cluster(cluster.name, say=say)
    except UserError as e:  # unreachable, no Python or partition there, a job Slurm refuses: not worth keeping
        cluster.remove()
        text = str(e)
        raise UserError(text + (" " if text.endswith((".", "?")) else ". ") + "The machine was not added.") from None


def remove_box(name: str) -> None:
    """Forgets a box or a cluster (nothing on it is touched); refused while a run has a session there."""
    running = active_runs().get(name)
    if running:
        raise UserError(f"machine '{name}' runs {', '.join(running)} now: `lab cancel {running[0]}` first "
                        "(its outputs come back), then remove it")
    (clusters.Cluster if kind_of(name) == "slurm" else boxes.Box).get(name).remove()


def check_box(name: str, say: Callable[[str], None] = print) -> dict:
    """`lab machines check NAME`: a box's or a cluster's check, stored and returned."""
    return (check_cluster if kind_of(name) == "slurm" else check_machine)(name, say=say)


def box_record(name: str) -> dict | None:
    return read_check(name)


def box_age(record: dict) -> str:
    return age(record)


def box_problem(name: str) -> str | None:
    """Why the box's last check says it cannot run the lab's sessions, or None."""
    return check_problem(name)
