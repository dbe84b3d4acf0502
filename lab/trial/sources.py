"""The trial session's code as the probe notebook and a box's check send it: the kernel modules
the worker trains with (the training notebook's own step), the worker, and the session half.
Each is pasted without its lab imports: the pasted kernel modules bring what they would."""
from __future__ import annotations

from pathlib import Path

from lab.notebooks import kernel_source

GPU_SIZE = {"context": 1024, "width": 512, "heads": 8, "layers": 8, "vocab": 4000, "batch_per_card": 6}
CPU_SIZE = {"context": 32, "width": 32, "heads": 2, "layers": 2, "vocab": 512, "batch_per_card": 4}
# What lab.trial.worker imports of the kernel side, in the order the training notebook pastes it;
# then what it imports of lab.trial, pasted after those.
WORKER_USES = ("config", "model", "speed", "step")
WORKER_TRIAL = ("parts",)
HERE = Path(__file__).resolve().parent


def worker_source() -> str:
    """The probe's worker as one script for torchrun: the kernel modules it trains with (the
    loop's own step), the parts' microbenchmark, then the burst (a box's check runs the same)."""
    worker = _pasted(HERE / "worker.py")
    trial = [_pasted(HERE / f"{name}.py") for name in WORKER_TRIAL]
    return "\n\n".join([*map(kernel_source, WORKER_USES), *trial, worker])


def session_source() -> str:
    """The probe session's code, as the probe notebook pastes it (a box's check sends it too)."""
    return "\n\n".join([kernel_source("signals"), kernel_source("preflight"),
                        _pasted(HERE / "session.py")])


def _pasted(path: Path) -> str:
    """A module's code without its lab imports (the notebook pastes what they would bring)."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines()
             if not line.startswith(("from lab", "import lab", "from __future__"))]
    return "\n".join(lines).strip() + "\n"
