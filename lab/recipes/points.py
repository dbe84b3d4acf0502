"""Points: (weights N, tokens D, final val loss) of runs whose learning rate ended small.

The law L(N, D) holds only for a run that ends at a small rate (the scaling-laws note), so
a run counts as a point only when it reached `steps_until` with a val loss there, its
schedule decays to a floor of at most `SMALL_LR` of its peak at that step, and it did not
diverge. A run's
val set and tokenizer travel with its point: points of different ones are never fitted
together — unless on the scale of bits per byte (`in_bits_per_byte`), where the loss is bits
per byte of the held-out text and D the bytes of text trained on, so runs of any tokenizer on
one val text fit together. Stdlib only.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from lab.config import RunConfig, UserError
from lab.corpus.manifests import read_manifest, val_text_id
from lab.kernel.metrics import read_metrics
from lab.models.bpb import data_folder_of, val_bpb
from lab.runs import list_runs
from lab.sizing.cards import weight_count

SMALL_LR = 0.25  # a rate that ended at most a quarter of its peak counts as "ended small"
DIVERGED = "diverged.json"  # in a run folder: the run was stopped as diverging, not a point


@dataclass
class Point:
    weights: int
    tokens: int
    val_loss: float
    lr: float | None = None
    schedule: str | None = None
    val_set: str | None = None
    tokenizer: str | None = None
    run: str | None = None
    branch_of: str | None = None  # the parent run of a cooldown branch
    layers: int | None = None
    width: int | None = None
    val_bpb: float | None = None  # the val loss in bits per byte (`lab.models.bpb`)
    val_text: str | None = None  # the held-out text's id, the same under any tokenizer
    train_bytes: int | None = None  # D in bytes: the tokens trained on × the train split's bytes per token

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def group_key(p: Point) -> tuple[str | None, str | None]:
    return p.val_set, p.tokenizer


def groups(points: Iterable[Point]) -> dict[tuple, list[Point]]:
    out: dict[tuple, list[Point]] = {}
    for p in points:
        out.setdefault(group_key(p), []).append(p)
    return out


def in_bits_per_byte(points: Iterable[Point]) -> list[Point]:
    """The points on the tokenizer-free scale: val_loss in bits per byte, tokens in bytes of
    text, grouped by the held-out text alone. Points that lack either figure are left out."""
    return [replace(p, val_loss=p.val_bpb, tokens=p.train_bytes, val_set=p.val_text, tokenizer=None)
            for p in points if p.val_bpb and p.train_bytes and p.val_text]


def sizes_with_enough_tokens(points: Sequence[Point], min_d: int) -> list[int]:
    per: dict[int, set[int]] = {}
    for p in points:
        per.setdefault(p.weights, set()).add(p.tokens)
    return sorted(n for n, ds in per.items() if len(ds) >= min_d)


def read_points_file(path: str | os.PathLike) -> list[Point]:
    """JSON lines `{"weights": N, "tokens": D, "val_loss": L}` (other Point keys optional)."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UserError(f"cannot read points file {path}: {e.strerror}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            p = Point(**{k: v for k, v in row.items() if k in Point.__dataclass_fields__})
            p.weights, p.tokens, p.val_loss = int(p.weights), int(p.tokens), float(p.val_loss)
        except (ValueError, TypeError) as e:
            raise UserError(f"{path}:{i}: not a point ({e}); each line is "
                            f'{{"weights": N, "tokens": D, "val_loss": L}}') from None
        if p.weights <= 0 or p.tokens <= 0 or not p.val_loss > 0:
            raise UserError(f"{path}:{i}: weights, tokens and val_loss must be positive")
        out.append(p)
    return out


def write_points_file(path: str | os.PathLike, points: Iterable[Point]) -> None:
    Path(path).write_text("".join(json.dumps(p.to_dict()) + "\n" for p in points), encoding="utf-8")


# --- the lab's own points ---------------------------------------------------------------

def run_point(run) -> tuple[Point | None, str]:
    """The point a registry run gives, or None and why not."""
    folder = run.folder
    if (folder / DIVERGED).exists():
        return None, "diverged"
    cfg: RunConfig = run.cfg
    rows = read_metrics(folder)
    evals = [r for r in rows if "val_loss" in r]
    if not evals or evals[-1]["step"] < cfg.steps_until:
        return None, "not finished (no val loss at steps_until)"
    last = evals[-1]
    if not isinstance(last["val_loss"], (int, float)) or not math.isfinite(last["val_loss"]):
        return None, "val loss is not finite"
    if not ends_small(cfg):
        return None, "its rate did not end small"
    vocab = _vocab(folder, cfg)
    if vocab is None:
        return None, "vocabulary unknown"
    return Point(weights=weight_count(cfg.layers, cfg.width, vocab, cfg.context), tokens=int(last["tokens"]),
                 val_loss=float(last["val_loss"]), lr=cfg.lr, schedule=cfg.schedule,
                 val_set=last.get("val_set"), tokenizer=_tokenizer(folder, cfg), run=run.id,
                 branch_of=(run.parent or {}).get("run") if is_branch(run) else None,
                 layers=cfg.layers, width=cfg.width, **_bytes_scale(last, cfg)), "point"


def _bytes_scale(row: dict, cfg: RunConfig) -> dict:
    """val_bpb, val_text and train_bytes of a run's last val row, where its data is at hand."""
    from lab.corpus.valtext import val_bytes  # numpy, sentencepiece: only where the data is at hand
    folder = data_folder_of(row.get("val_set"), cfg)
    if folder is None:
        return {}
    manifest = read_manifest(folder)
    text_bytes = sum(c.get("bytes", 0) for c in manifest["constellations"].values())
    per_token = (text_bytes - val_bytes(folder)) / manifest["train_tokens"]
    return {"val_bpb": val_bpb(row, cfg), "val_text": val_text_id(manifest),
            "train_bytes": round(int(row["tokens"]) * per_token)}


def ends_small(cfg: RunConfig) -> bool:
    """The run's schedule decays to a small floor at `steps_until` (a WSD stage that ends in
    its constant phase does not; its cooldown branches do)."""
    if cfg.min_lr_frac > SMALL_LR:
        return False
    if cfg.schedule in ("cosine", "linear"):
        return True
    decay_start = cfg.decay_start or cfg.steps_until - int(cfg.decay_frac * cfg.steps_until)
    return decay_start < cfg.steps_until


def is_branch(run) -> bool:
    """A cooldown branch: a child run whose decay starts at the step it branched from."""
    return bool(run.parent and run.cfg.decay_start and run.parent.get("step") == run.cfg.decay_start)


def lab_points(runs=None) -> list[Point]:
    """Every point among the registry's runs (default: all of them)."""
    if runs is None:
        runs = list_runs()
    return [p for p in (run_point(r)[0] for r in runs) if p is not None]


def _vocab(folder: Path, cfg: RunConfig) -> int | None:
    try:
        return int(json.loads((folder / "device.json").read_text())["vocab"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    manifest = _manifest(cfg)
    return ((manifest or {}).get("tokenizer") or {}).get("vocab")


def _tokenizer(folder: Path, cfg: RunConfig) -> str | None:
    for side in sorted((folder / "checkpoints").glob("ckpt_*.json"), reverse=True):
        try:
            sha = json.loads(side.read_text()).get("tokenizer_sha256")
        except (OSError, ValueError):
            continue
        if sha:
            return sha
    return ((_manifest(cfg) or {}).get("tokenizer") or {}).get("sha256")


def _manifest(cfg: RunConfig) -> dict | None:
    if not cfg.data_dir:
        return None
    try:
        return read_manifest(cfg.data_dir)
    except UserError:
        return None


# --- divergence -------------------------------------------------------------------------

class DivergenceWatch:
    """Says when a run diverges: a loss that is not a number, or a smoothed loss far above
    where the run started (`factor` × the median of its first logged losses)."""

    def __init__(self, factor: float = 1.3, start_rows: int = 3, smooth: int = 5):
        self.factor, self.start_rows, self.smooth = factor, start_rows, smooth
        self.first: list[float] = []
        self.recent: list[float] = []

    def see(self, row: dict) -> str | None:
        """Feeds one metrics row; returns why the run diverged, or None."""
        loss = row.get("loss")
        if loss is None:
            loss = row.get("val_loss")
        if loss is None:
            return None
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            return f"loss is {loss} at step {row.get('step')}"
        if len(self.first) < self.start_rows:
            self.first.append(loss)
            return None
        self.recent = (self.recent + [loss])[-self.smooth:]
        start = sorted(self.first)[len(self.first) // 2]
        mean = sum(self.recent) / len(self.recent)
        if len(self.recent) == self.smooth and mean > self.factor * start:
            return f"loss {mean:.3g} at step {row.get('step')} is far above its start {start:.3g}"
        return None


def mark_diverged(folder: Path, why: str, step: int | None = None) -> None:
    (Path(folder) / DIVERGED).write_text(json.dumps({"why": why, "step": step}), encoding="utf-8")


def diverged_why(folder: Path) -> str | None:
    try:
        return json.loads((Path(folder) / DIVERGED).read_text())["why"]
    except (OSError, ValueError, KeyError):
        return None
