"""The kit keeps itself honest: what the calculator predicted for a run, written when the run
is registered (`lab.settle.register_run`, before it has measured itself), against the speed the
run then measured.

`predicted.json` in the run's folder holds one prediction per card the run was sized for:
{"predictions": {"cpu": {"tok_s", "kind", "interval", "from", "precision", "run_hours",
"quota_hours", "at"}}}. The first prediction for a card stays: a later one would already
count the run's own measurement.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from lab.config import RunConfig
from lab.sizing.estimate import estimate
from lab.sizing.speeds import lab_runs, measured_runs, median, run_info, steady_tok_s

PREDICTED = "predicted.json"


def record_prediction(folder: Path, cfg: RunConfig, gpu: str | None = None) -> dict | None:
    """Writes the calculator's prediction for the run in `folder` on `gpu` (default: the card
    the run is sized for) unless one is there for that card; returns it. Never raises: a run
    goes on without it. `lab.settle.register_run` calls it for every run the lab registers
    (the form's Start, lab run, lab branch, lab sweep), `lab train` for its --out folder."""
    try:
        folder = Path(folder)
        cfg = replace(cfg, gpu=gpu) if gpu else cfg
        others = [m for m in measured_runs() if m.run != folder.name]  # not the run's own rows
        est = estimate(cfg, runs=others)
        if est.tok_s.value is None:
            return None
        data = read_predictions(folder)
        if est.gpu in data:
            return data[est.gpu]
        entry = {"tok_s": est.tok_s.value, "kind": est.tok_s.kind, "interval": est.tok_s.extra.get("interval"),
                 "from": est.tok_s.extra.get("from", []), "precision": est.precision,
                 "run_hours": est.run_hours.value, "quota_hours": est.quota_hours.value,
                 "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        _write(folder, {**data, est.gpu: entry})
        return entry
    except Exception:  # noqa: BLE001 -- a prediction is a courtesy; registering the run must not fail on it
        return None


def read_predictions(folder: Path) -> dict:
    """{card: prediction} from the run's predicted.json; empty when there is none."""
    try:
        data = json.loads((Path(folder) / PREDICTED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    preds = data.get("predictions") if isinstance(data, dict) else None
    return preds if isinstance(preds, dict) else {}


def _write(folder: Path, predictions: dict) -> None:
    tmp = folder / f".{PREDICTED}.tmp"
    tmp.write_text(json.dumps({"predictions": predictions}, indent=1), encoding="utf-8")
    os.replace(tmp, folder / PREDICTED)


@dataclass(frozen=True)
class Check:
    """A run's predicted speed beside its measured one, on the card it measured on."""
    run: str
    gpu: str
    predicted: float
    measured: float | None  # None: not enough steps yet
    interval: tuple[float, float] | None
    kind: str

    @property
    def error(self) -> float | None:
        """predicted / measured − 1: +0.10 is a prediction 10% too fast."""
        return None if not self.measured else self.predicted / self.measured - 1

    @property
    def within(self) -> bool | None:
        if self.measured is None or self.interval is None:
            return None
        return self.interval[0] <= self.measured <= self.interval[1]

    def text(self) -> str:
        """"6,232 (pred. 5,980, −4%)" for a table cell."""
        if self.measured is None:
            return f"? (pred. {self.predicted:,.0f})"
        return f"{self.measured:,.0f} (pred. {self.predicted:,.0f}, {self.error:+.0%})"


def check(folder: Path) -> Check | None:
    """The run's prediction against its measured speed, on the card its latest session ran
    on; None when it has no prediction for that card."""
    folder = Path(folder)
    info = run_info(str(folder))
    preds = read_predictions(folder)
    gpu = info["gpu"] if info else next(iter(preds), None)
    p = preds.get(gpu) if gpu else None
    if not isinstance(p, dict) or not isinstance(p.get("tok_s"), (int, float)):
        return None
    interval = p.get("interval")
    measured = steady_tok_s(str(folder)) if info else None
    return Check(folder.name, gpu, float(p["tok_s"]), measured,
                 tuple(interval) if isinstance(interval, list) and len(interval) == 2 else None, str(p.get("kind")))


def summary(root: Path | None = None) -> str:
    """One line: the prediction error across the lab's runs that have both figures."""
    folders = lab_runs() if root is None else [(p.name, str(p)) for p in sorted(Path(root).iterdir()) if p.is_dir()]
    checks = [c for c in (check(Path(f)) for _, f in folders) if c is not None and c.error is not None]
    if not checks:
        return "calibration: no run has both a prediction and a measured speed yet"
    errors = [abs(c.error) for c in checks]
    worst = max(checks, key=lambda c: abs(c.error))
    with_interval = [c for c in checks if c.within is not None]
    inside = sum(1 for c in with_interval if c.within)
    coverage = (f"coverage {inside} of {len(with_interval)} within their 95% interval ({inside / len(with_interval):.0%}; "
                f"the calculator aims at 9 of 10 or more)") if with_interval else "no interval recorded"
    return (f"calibration: {len(checks)} run(s), prediction error median {median(errors):.0%}, worst "
            f"{worst.error:+.0%} ({worst.run}, {worst.gpu}); {coverage}")

