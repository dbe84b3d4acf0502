"""The kinds of machine the lab runs on, and each machine found by its name. A kind is one entry in KINDS:
a `lab.machines.base.Host` subclass ("module:Class", imported when first asked) with its `kind`, a `names()`
classmethod listing the lab's machines of that kind, and a constructor taking the name."""
from __future__ import annotations

import importlib

from lab.config import Problem, RunConfig, UserError
from lab.machines.base import Host
from lab.runs import Link

KINDS: dict[str, str | type[Host]] = {
    "local": "lab.machines.local:LocalHost",  # this computer, always named "local"
    "kaggle": "lab.machines.kaggle.host:KaggleHost",  # each Kaggle account of lab.kaggle.accounts
    "ssh": "lab.machines.ssh.host:SshHost",  # each of the lab's own boxes (or groups) of lab.machines.ssh.boxes
    "slurm": "lab.machines.slurm.host:SlurmHost",  # each of the lab's Slurm clusters of lab.machines.slurm.cluster
    "inline": "lab.machines.local:InlineHost",  # this computer in the driving process (`lab sweep --inline`)
}


def host_class(kind: str) -> type[Host]:
    entry = KINDS.get(kind)
    if entry is None:
        raise UserError(f"no kind of machine {kind!r} (the lab knows {', '.join(KINDS)})")
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
    return entry


def _named(listed: bool = True) -> list[tuple[str, str]]:
    """(name, kind) of each machine, in KINDS order; a name two kinds list is the first's. `listed`: not `inline`."""
    seen: dict[str, str] = {}
    for kind in KINDS:
        cls = host_class(kind)
        if cls.listed or not listed:
            for name in cls.names():
                seen.setdefault(name, kind)
    return list(seen.items())


def machine_names() -> list[str]:
    return [name for name, _ in _named()]


def kind_of(name: str) -> str:
    named = dict(_named(listed=False))
    if name not in named:
        raise UserError(f"no machine '{name}' in the lab; its machines: {', '.join(machine_names())} (`lab "
                        "machines` shows them; `lab accounts add NAME --kaggle-json PATH` adds a Kaggle account, "
                        "`lab machines add NAME --ssh HOST` a box, `lab machines add NAME --slurm LOGIN_HOST` a "
                        "Slurm cluster)")
    return named[name]


def host_for(name: str) -> Host:
    return host_class(kind_of(name))(name)


def hosts(only: str | None = None) -> list[Host]:
    return [host_class(kind)(name) for name, kind in _named(listed=only is None) if only is None or name == only]


def limits(cfg: RunConfig) -> list[Problem]:
    """What the run's fields meet where it goes: its machine's own limits, or under Auto each kind's, as notes."""
    if (cfg.machine or "auto") == "auto":
        return [p for kind in KINDS if host_class(kind).listed for p in host_class(kind).limits_under_auto(cfg)]
    try:
        return host_for(cfg.machine).limits(cfg)
    except UserError:  # a machine not in the lab: registering it says so (lab.settle.check_machine)
        return []


def class_of(link: Link) -> type[Host]:
    return host_class(link.kind if link.kind in KINDS else kind_of(link.machine))


def host_of(link: Link) -> Host:
    return class_of(link)(link.machine)
