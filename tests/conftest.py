"""Shared fixtures: a lab home with the embedded `pydoc` constellation prepared once per session,
and a home of its own with one tiny model trained in it (`trained`)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

# The suite runs in several processes on a couple of cores (scripts/test): one thread each for
# torch here and in every process a test starts (they inherit it). More threads only spin against
# each other's. Set before anything imports torch; a test that needs another count sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The calculator measures this computer's parts (~10 s of torch) the first time it sizes a run here:
# in every fresh test home that would be a measurement per test. The tests of it turn it back on.
os.environ.setdefault("LAB_MEASURE_PARTS", "0")

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--context", "32", "--width", "32", "--heads", "2", "--layers", "2", "--batch-per-card", "4",
        "--eval-every", "10", "--eval-batches", "2", "--lr", "3e-3", "--warmup-steps", "2"]
# For tests that compare arithmetic across batch splits, processes or compilation: under bf16
# autocast (what auto picks on a CPU with bf16 instructions) other shapes round differently.
FP32 = ["--precision", "fp32"]


# The longest single tests first (each a minute or more on the 2-vCPU VM: `./scripts/test
# --durations=20`): xdist hands out tests in their collection order, and a long one collected last
# would be the whole suite's tail. The order within each stays as collected.
LONG_FIRST = ("tests/ui/test_browser.py", "tests/machines/test_ssh_group.py", "tests/machines/test_kaggle_quirk_runs.py",
              "tests/machines/test_kaggle_overnight.py", "tests/probe/test_probe.py",
              "tests/machines/test_kaggle_runs.py", "tests/kernel/test_resume.py")


def pytest_collection_modifyitems(items: list) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))


@pytest.fixture(scope="session", autouse=True)
def forked_kernels():
    """Every Jupyter kernel the tests start (and the processes they start start) is forked from
    one that has imported torch already (tests/forked_kernels.py): LAB_TEST_FORKED_KERNELS=0
    starts each the usual way."""
    if os.environ.get("LAB_TEST_FORKED_KERNELS", "1") == "0":
        yield
        return
    import shutil
    import tempfile
    from tests import forked_kernels
    where = Path(tempfile.mkdtemp(prefix="lab-kernels-"))  # short: a socket's path has a limit
    forked_kernels.install_kernelspec(where)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(where), os.environ.get("JUPYTER_PATH")]))
    server = forked_kernels.start_server(where)
    yield
    server.kill()
    server.wait()
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
def lab_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("lab-home")
    os.environ["LAB_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def pydoc_data(lab_home) -> Path:
    """The `pydoc` constellation prepared with a small vocabulary (fast to train on)."""
    from lab import corpus
    return corpus.prepare(["pydoc"], vocab=512, progress=False)


def wait_for(condition, timeout_s: float = 120.0, what: str = "the condition") -> None:
    """Waits until `condition()` holds, or fails the test naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def lab(*args: str, check: bool = True, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """Runs the `lab` command as a person would, in a fresh process."""
    proc = subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"lab {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def lab_here(*args: str) -> tuple[int, str, str]:
    """`lab ARGS` in this process: (exit status, stdout, stderr). For what needs no process of
    its own (config and data errors, runs whose signals nobody sends)."""
    import contextlib
    import io
    from lab.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


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
    from lab.runs import Settled, create_run
    cfg = RunConfig(**{**TINY_RUN, **fields, "data_dir": str(data)})
    run = create_run(Settled.whole(cfg))
    train(cfg, run.folder, data, log=lambda s: None)
    return run


@pytest.fixture(scope="session")
def trained(tmp_path_factory, lab_home) -> SimpleNamespace:
    """A lab home of its own with `pydoc` prepared (vocab 512) and one tiny run trained on it
    (fp32, 40 steps): the models' and the "Try the model" tests sample, measure and export it.
    Its runs stay out of the other tests' registry (the calculator would take them for measured
    speeds); tests that use it set LAB_HOME to `trained.home`."""
    home = tmp_path_factory.mktemp("models-home")
    with lab_home_at(home):
        from lab import corpus
        data = corpus.prepare(["pydoc"], vocab=512, progress=False)
        run = train_run(data)
    return SimpleNamespace(home=home, data=data, run=run)


@pytest.fixture(scope="session")
def loaded(trained):
    """The trained run's model, loaded as `lab sample` loads it (CPU, fp32)."""
    with lab_home_at(trained.home):
        from lab.models.loading import load_model
        return load_model(trained.run.id, device="cpu")
