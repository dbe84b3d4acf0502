"""A machine's parts as its short microbenchmark measured them (`lab.trial.parts`), turned into
the shape of the step-time model (`lab.sizing.steptime`): seconds per unit of each part and the
matrix products' rate by width.

Where a measurement lives:
- this computer: `$LAB_HOME/sizing/parts/cpu-<precision>-<threads>t.json`, one per precision and
  thread count, written the first time `lab size` or the form sizes a run here (`lab.api.sizing`)
  and again by `lab size --measure-parts`; it holds the processor's name and is not used on another;
- a Kaggle account's cards: its `lab probe`, whose worker measures one card's parts after its burst
  (`accounts/<name>/probe.json`: facts.worker.parts);
- a box's or a cluster's cards: its check (`machines/<name>/check.json`: the first host's
  worker.parts).
Stdlib only: the calculator reads them on every keystroke (cached by mtime).
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from lab.corpus.manifests import read_json_cached
from lab.home import accounts_dir, lab_home, machines_dir
from lab.sizing.steptime import CACHE_BYTES, Curve, Curves

FORMAT = 1
# Above this load average per core, other work shared the machine while its parts were timed: the
# calculator says so beside the figures (they may be off in shape as well as in level).
BUSY_LOAD = 0.5
# Or its own timings' median spread above this: two threads beside one busy core wait on each other
# (10 ms a layer where 0.4 was measured quiet, on the 2-vCPU EPYC VM, 2026-12-03).
NOISY_SPREAD = 0.3


@dataclass(frozen=True)
class Shape:
    """A machine's parts in the units of `steptime.PARTS`, and where they were measured."""
    parts: tuple[float, ...]
    curves: Curves
    where: str  # "this computer", "probe of alice", "check of gpu-box"
    where_ru: str
    at: str  # when, ISO date
    spread: float  # the microbenchmark's own median spread: how busy the machine was then
    threads: int | None = None
    busy: float | None = None  # the load average per core as it was measured, where it was above a half

    @property
    def unsteady(self) -> bool:
        """Timed beside other work, or moving too much to say the machine's shape."""
        return bool(self.busy) or self.spread > NOISY_SPREAD

    def why_unsteady(self, lang: str = "en") -> str:
        if self.busy:
            return (f"the machine was busy then (load {self.busy:.1f} per core)" if lang == "en" else
                    f"машина тогда была занята (нагрузка {self.busy:.1f} на ядро)".replace(".", ",", 1))
        return (f"its own timings moved by {self.spread:.0%}" if lang == "en" else
                f"его собственные замеры разошлись на {self.spread:.0%}")

    @property
    def note(self) -> str:
        busy = (f"; {self.why_unsteady()}: `lab size --measure-parts` when it is quiet measures them again"
                if self.unsteady else "")
        return f"the parts measured on {self.where} ({self.at[:10]}" + (
            f", {self.threads} thread(s)" if self.threads else "") + f"){busy}"

    @property
    def note_ru(self) -> str:
        busy = (f"; {self.why_unsteady('ru')}: `lab size --measure-parts` на свободной измерит их снова"
                if self.unsteady else "")
        return f"части, измеренные на {self.where_ru} ({self.at[:10]}" + (
            f", потоков: {self.threads}" if self.threads else "") + f"){busy}"


def parts_dir() -> Path:
    return lab_home() / "sizing" / "parts"


def local_file(precision: str, threads: int) -> Path:
    return parts_dir() / f"cpu-{precision}-{threads}t.json"


@functools.lru_cache(maxsize=1)
def processor() -> str:
    """This computer's processor, as /proc/cpuinfo names it (elsewhere the platform's word)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform  # only where /proc/cpuinfo is not
    return platform.processor() or platform.machine() or "unknown"


def save_local(record: dict) -> Path:
    """Keeps this computer's measurement (`lab.trial.parts.measure_parts`'s record) for the calculator."""
    record = {**record, "processor": processor(), "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = local_file(record["precision"], int(record["threads"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    os.replace(tmp, path)  # a calculator reading meanwhile sees the old file or the new, whole
    return path


def local_shape(precision: str, threads: int) -> Shape | None:
    """This computer's parts in `precision` on `threads`, where measured on this processor and
    steadily (a measurement beside other work is `unsteady_local`'s: its shape is not used)."""
    shape = _local(precision, threads)
    return None if shape is None or shape.unsteady else shape


def unsteady_local(precision: str, threads: int) -> Shape | None:
    """This computer's parts measured while it was busy (or moving too much), which the calculator
    does not use: the prior's note says so, and the next quiet sizing measures them again."""
    shape = _local(precision, threads)
    return shape if shape is not None and shape.unsteady else None


def _local(precision: str, threads: int) -> Shape | None:
    record = read_json_cached(local_file(precision, threads))
    if not _usable(record, "cpu", precision) or record.get("processor") != processor():
        return None
    return shape_of(record, "this computer", "этом компьютере", threads=threads)


def card_shape(card: str, precision: str) -> Shape | None:
    """The parts of `card` (a `card_for` name: "2xT4", a box's card set) in `precision`, from the
    newest probe or check that measured them."""
    found = []
    for path, where, where_ru in _records():
        record = read_json_cached(path)
        if not isinstance(record, dict) or record.get("gpu") != card:
            continue
        worker = _worker_of(record)
        if _usable(worker.get("parts"), "cuda", precision):
            found.append((str(record.get("at") or ""), worker, where, where_ru))
    if not found:
        return None
    at, worker, where, where_ru = max(found, key=lambda f: f[0])
    cards = max(1, int(worker.get("world") or 1))
    bus = (worker.get("all_reduce") or {}).get("bus_gb_s") if cards > 1 else None
    return shape_of({**worker["parts"], "at": at}, where, where_ru, allreduce_gb_s=bus)


def _records() -> list[tuple[Path, str, str]]:
    """(record, where, where in Russian) of every probe and check in the lab home."""
    out = []
    for root, name, what, what_ru in ((accounts_dir(), "probe.json", "probe of", "пробе"),
                                      (machines_dir(), "check.json", "check of", "проверке")):
        try:
            entries = sorted(e.name for e in os.scandir(root) if e.is_dir())
        except OSError:
            continue
        out += [(root / e / name, f"{what} {e}", f"{what_ru} {e}") for e in entries]
    return out


def _worker_of(record: dict) -> dict:
    """The worker's result in a probe's record (facts.worker) or a check's (its first host's)."""
    if isinstance(record.get("facts"), dict):
        worker = record["facts"].get("worker")
    else:
        hosts = record.get("hosts") or [{}]
        worker = hosts[0].get("worker") if isinstance(hosts[0], dict) else None
    return worker if isinstance(worker, dict) else {}


def _usable(record, device: str, precision: str) -> bool:
    return (isinstance(record, dict) and record.get("format") == FORMAT and record.get("device") == device
            and record.get("precision") == precision and isinstance(record.get("matmul"), list)
            and isinstance(record.get("attention"), list))


def monotone(curve: list[tuple[float, float]]) -> Curve:
    """The cost per FLOP by width (or context) made non-increasing (pooling neighbours that disagree,
    in log space): a wider product never runs at a lower rate, and a busy second in one width's
    timing must not bend the model's shape."""
    blocks: list[list[float]] = []  # [sum of logs, count]
    for _, s in curve:
        blocks.append([math.log(s), 1])
        while len(blocks) > 1 and blocks[-1][0] / blocks[-1][1] > blocks[-2][0] / blocks[-2][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    values = [math.exp(t / n) for t, n in blocks for _ in range(int(n))]
    return tuple((float(w), v) for (w, _), v in zip(curve, values))


def shape_of(record: dict, where: str, where_ru: str, threads: int | None = None,
             allreduce_gb_s: float | None = None) -> Shape:
    """The parts of PARTS from a measurement: the matmul at its widest width and attention at its
    longest context (their curves carry the rest), the elementwise work split into its in-cache cost
    and the extra once it spills
    (on a GPU none: its elementwise work runs at memory bandwidth already), the loss per logit, the
    optimizer per weight (on several cards with the all-reduce a backward pass leaves exposed, a
    fifth of a ring's 4 bytes per weight), a layer, a step."""
    curves = Curves(monotone([(float(w), float(s)) for w, s in record["matmul"]]),
                    monotone([(float(n), float(s)) for n, s in record["attention"]]))
    small, large = record["elementwise"]["small"], record["elementwise"]["large"]
    if record["device"] == "cpu":
        f_small, f_large = _spilled(small), _spilled(large)
        spill = max(0.0, (large["s_per_element"] - small["s_per_element"]) / max(f_large - f_small, 1e-9))
        activation = max(0.0, small["s_per_element"] - spill * f_small)
    else:
        spill, activation = 0.0, large["s_per_element"]
    per_weight = record["weights"] + (0.2 * 4 / (allreduce_gb_s * 1e9) if allreduce_gb_s else 0.0)
    parts = (curves.matmul[-1][1], curves.attention[-1][1], activation, spill, record["logits"], per_weight,
             record["layer"], record["step"])
    load, cpus = record.get("load"), record.get("cpus") or 1
    busy = load / cpus if isinstance(load, (int, float)) and load / cpus > BUSY_LOAD else None
    return Shape(tuple(float(p) for p in parts), curves, where, where_ru, str(record.get("at") or ""),
                 float(record.get("spread") or 0.0), threads, busy)


def _spilled(e: dict) -> float:
    """The share of a tensor of that size that outgrows the cache (`steptime.Size.parts`' B/(B+C))."""
    tensor = 4.0 * e["batch"] * e["context"] * e["width"]
    return tensor / (tensor + CACHE_BYTES)
