"""The lab as the control notebook's widgets and the `lab` command both use it: one typed API.

    runs       preview and size a run, start, continue, branch, cancel, a run's status, the runs
    machines   the lab's machines and their state, the Auto rule's pick, a machine's check, boxes
    accounts   Kaggle accounts: add, remove, quota, their checkpoint datasets, the probe
    data       constellations declared, edited, removed; uploads; prepare
    models     a trained model in use: sample, eval, export
    recipes    sweeps, the L(N, D) fit, cooldown branches
    train      `lab train`: a run's loop here, without the registry
    curves     runs' loss curves as the faces draw them, and "when to grow"
    words      numbers as a person reads them in the lab's two languages

Each module is imported by whoever needs it (`from lab.api import runs`): the command's fast
subcommands never pay for torch.
"""
from __future__ import annotations

import lab

VERSION = lab.__version__  # the kit's version, as the faces say it (`lab --version`, the setup cell)
