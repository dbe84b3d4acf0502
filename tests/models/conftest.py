"""The models tests' own lab home, with one tiny model trained once per session: their runs
must not show up in the other tests' registry (the calculator would take them for measured
speeds)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

TINY_RUN = dict(context=32, width=32, heads=2, layers=2, batch_per_card=4, eval_every=10, eval_batches=2, lr=3e-3,
                warmup_steps=2, steps_until=40, precision="fp32", torch_compile="off")


@contextmanager
def lab_home_at(home: Path):
    before = os.environ.get("LAB_HOME")
    os.environ["LAB_HOME"] = str(home)
    try:
        yield home
    finally:
        if before is None:
            os.environ.pop("LAB_HOME", None)
        else:
            os.environ["LAB_HOME"] = before


def train_run(data: Path, **fields):
    """A registry run trained in this process (`lab.kernel.train.train`, the loop itself)."""
    from lab.config import RunConfig
    from lab.kernel.train import train
    from lab.runs import create_run
    cfg = RunConfig(**{**TINY_RUN, **fields, "data_dir": str(data)})
    run = create_run(cfg)
    train(cfg, run.folder, data, log=lambda s: None)
    return run


@pytest.fixture(scope="session")
def trained(tmp_path_factory, lab_home) -> SimpleNamespace:
    """A lab home with `pydoc` prepared (vocab 512) and one tiny run trained on it."""
    home = tmp_path_factory.mktemp("models-home")
    with lab_home_at(home):
        from lab import corpus
        data = corpus.prepare(["pydoc"], vocab=512, progress=False)
        run = train_run(data)
    return SimpleNamespace(home=home, data=data, run=run)


@pytest.fixture(autouse=True)
def models_home(trained, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_HOME", str(trained.home))
    return trained.home


@pytest.fixture(scope="session")
def loaded(trained):
    """The trained run's model, loaded as `lab sample` loads it (CPU, fp32)."""
    with lab_home_at(trained.home):
        from lab.models.loading import load_model
        return load_model(trained.run.id, device="cpu")
