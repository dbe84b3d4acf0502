"""The sizing calculator and the one place a run's fields are validated.

The "New run" form calls `estimate` on every keystroke and `lab size` prints it, so this
module is stdlib-only and answers in about a millisecond once warm: files it reads
(data manifests, checkpoint sidecars, the lab's measured runs) are cached by mtime, and a
live run's metrics.jsonl is read incrementally.

Figures say where they come from (`kind`):
- "exact": arithmetic on the fields (weights, tokens per step) or counted (data tokens);
- "measured": a measurement at exactly this size and card (the guide's, or the lab's runs);
- "calibrated": scaled by FLOPs per token from the lab's own runs at the nearest sizes;
- "estimate": scaled from the guide's reference measurement, or a formula (memory);
- "unknown": not computable now (no prepared data, bad fields).

Entry points: `estimate(cfg) -> Estimate`, `validate(cfg) -> list[Problem]`,
`when_to_grow(metrics, manifest, cfg) -> Verdict`.
"""
from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from lab.config import MODEL_FIELDS, Problem, RunConfig, UserError, card_set, check, check_against_data, check_resume
from lab.corpus.manifests import prepared_folders, read_manifest
from lab.home import accounts_dir, data_dir, runs_dir

DEFAULT_VOCAB = 4000  # the lab's tokenizer, when no manifest or checkpoint says otherwise
TOKENS_PER_WEIGHT = 20  # the guide's "about 20 tokens of data per weight"
# The size at which the guide measured its speeds (and the form's defaults).
REFERENCE = {"context": 1024, "width": 512, "heads": 8, "layers": 8, "vocab": 4000, "batch_per_card": 6}
AUTO_GPU = "2xT4"  # "auto" sizes for Kaggle's machine: the Auto rule picks a Kaggle account first
STARTUP_MIN = 10.0  # a Kaggle session's start, data mount and the final checkpoint save
GB = 1e9  # memory is in decimal GB: "15 GB usable" on a T4 whose 16 GiB show as ~15.8e9 bytes
CPU_USABLE_FRACTION = 0.75  # of host memory; the rest is the OS, the notebook and data loading
CPU_TOK_S_PER_CORE = 240.0  # at the reference size: 480 tok/s on a 2-core EPYC, torch 2.13, fp32
ALLOCATOR_SLACK = 0.10  # PyTorch's caching allocator rounds and fragments blocks
EVAL_FORWARD_SHARE = 1 / 3  # an eval batch is a forward only: a third of a training micro-step

KIND_RU = {"exact": "точно", "measured": "замер", "calibrated": "по замерам лабы",
           "estimate": "оценка", "unknown": "неизвестно"}


@dataclass(frozen=True)
class Card:
    """A card (or pair of cards) a run can be sized for."""
    name: str
    cards: int
    usable_gb: float | None  # per card; None: host memory, read on first use
    precision: str  # what precision "auto" picks on it
    ref_tok_s: float  # at REFERENCE, all cards together
    ref_measured: bool  # the guide measured ref_tok_s; otherwise it is our estimate
    kaggle: bool  # runs on Kaggle and spends an account's weekly quota
    context_gb: float  # CUDA context and cuBLAS workspaces, outside PyTorch's allocator


# How memory messages name the card: (English, Russian).
CARD_WHERE = {"2xT4": ("each T4", "на каждой T4"), "T4": ("a T4", "на T4"), "rtx3050": ("an RTX 3050", "на RTX 3050"),
              "cpu": ("this computer", "на этом компьютере")}

CARDS = {
    "2xT4": Card("2xT4", 2, 15.0, "fp16", 102_000.0, True, True, 0.5),
    "T4": Card("T4", 1, 15.0, "fp16", 49_000.0, True, True, 0.5),
    # Not measured. The guide: "slower than one T4". Its bf16 tensor rate with fp32
    # accumulation (~18 TFLOPS) and 224 GB/s put it near 0.7 of a power-capped T4.
    "rtx3050": Card("rtx3050", 1, 8.0, "bf16", 34_000.0, False, False, 0.5),
    "cpu": Card("cpu", 1, None, "fp32", 0.0, False, False, 0.0),
}


# ---------------------------------------------------------------------------------------
# Formulas


def weight_count(layers: int, width: int, vocab: int, context: int) -> int:
    """12·layers·d² + vocab·d + n·d: per block q, k, v, out (4·d²) and the 4·d MLP (8·d²);
    no biases, norms without weights, the output head tied to the token embedding.
    (The same one-liner as `lab.model.weight_count`, which imports torch.)"""
    return 12 * layers * width * width + vocab * width + context * width


def flops_per_token(layers: int, width: int, vocab: int, context: int) -> float:
    """Training FLOPs per token: 6·N for the matrix products forward and backward, plus
    12·layers·n·d for attention's scores and weighted sums (PaLM's accounting)."""
    return 6 * weight_count(layers, width, vocab, context) + 12 * layers * context * width


def _bytes_per_value(precision: str) -> int:
    return 4 if precision == "fp32" else 2


@dataclass
class Memory:
    """Peak memory of one card during a training step, in bytes, by part."""
    weights_and_optimizer: int
    activations: int
    logits: int
    slack: int
    cuda_context: int

    @property
    def total(self) -> int:
        return self.weights_and_optimizer + self.activations + self.logits + self.slack + self.cuda_context

    def parts_gb(self) -> dict:
        return {k: round(getattr(self, k) / GB, 3) for k in
                ("weights_and_optimizer", "activations", "logits", "slack", "cuda_context")}


def memory_bytes(context: int, width: int, heads: int, layers: int, vocab: int, batch_per_card: int,
                 precision: str = "fp16", cards: int = 1, cuda_context_gb: float = 0.5) -> Memory:
    """Peak bytes on one card for one micro-step. N weights, T = batch·n tokens,
    c = 2 bytes per activation value under fp16/bf16 autocast, 4 in fp32:

    weights and optimizer = N·(4 fp32 master + 4 fp32 grads + 8 AdamW moments
                              + 2 16-bit copies that autocast casts and backward keeps
                              + 4 DDP gradient buckets when there are 2 cards)
    activations = T·(layers·(8·d + 14·c·d + 8 + 4·heads) + 4·d + c·d + 4)
        per layer (what autograd saves; counted with saved-tensor hooks on this model):
        the fp32 residual stream into both norms (2·4·d) and their 1/rms (2·4);
        attention: norm output cast (d), q k v (3·d), SDPA output (d; flash and
        memory-efficient SDPA keep no n×n matrix, only a log-sum-exp per head, 4·heads);
        its layout makes the transpose before the projection free;
        MLP: norm output cast (d), up-projection (4·d, kept by GELU), GELU (4·d);
        that is 14 values of c bytes. After the last layer: the final norm's fp32 input,
        its 1/rms and its output cast.
    logits = T·max(12·V, 8·c·d + 8·d): the loss keeps fp32 log-softmax (4·V); its
        backward adds the gradient into and out of log-softmax (4·V + 4·V). Once it is
        freed, a layer's backward holds two 4·d gradients (c) and two fp32 residual ones.
    total = (weights and optimizer + activations + logits)·(1 + 10% allocator slack)
            + the CUDA context (0.5 GB on a GPU, none on CPU).
    """
    n_weights = weight_count(layers, width, vocab, context)
    c = _bytes_per_value(precision)
    static = n_weights * (16 + (2 if c == 2 else 0) + (4 if cards > 1 else 0))
    tokens = batch_per_card * context
    per_layer = 8 * width + 14 * c * width + 8 + 4 * heads
    activations = tokens * (layers * per_layer + 4 * width + c * width + 4)
    logits = tokens * max(12 * vocab, 8 * c * width + 8 * width)
    slack = int(ALLOCATOR_SLACK * (static + activations + logits))
    return Memory(static, activations, logits, slack, int(cuda_context_gb * GB))


def max_batch(context: int, width: int, heads: int, layers: int, vocab: int, usable_bytes: float,
              precision: str = "fp16", cards: int = 1, cuda_context_gb: float = 0.5) -> int:
    """The largest batch per card whose `memory_bytes` fits in `usable_bytes` (0: none)."""
    def total(b: int) -> int:
        return memory_bytes(context, width, heads, layers, vocab, b, precision, cards, cuda_context_gb).total
    per_sample = total(1) - total(0)
    b = max(0, int((usable_bytes - total(0)) // per_sample)) if per_sample > 0 else 0
    while b > 0 and total(b) > usable_bytes:  # integer rounding of the slack, at most a step
        b -= 1
    while total(b + 1) <= usable_bytes:
        b += 1
    return b


_host_bytes: float | None = None


def host_memory_bytes() -> float | None:
    """Physical memory of this computer (None where the platform will not say)."""
    global _host_bytes
    if _host_bytes is None:
        try:
            _host_bytes = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            return None
    return _host_bytes


def usable_bytes(card: Card) -> float | None:
    if card.usable_gb is not None:
        return card.usable_gb * GB
    host = host_memory_bytes()
    return None if host is None else CPU_USABLE_FRACTION * host


def reference_tok_s(card: Card) -> float:
    if card.name == "cpu":  # scales roughly with cores; calibrate with a short run
        return CPU_TOK_S_PER_CORE * (os.cpu_count() or 1)
    return card.ref_tok_s


def next_size(cfg: RunConfig) -> RunConfig:
    """The next size up, the guide's step: half as many layers again (8 -> 12)."""
    return replace(cfg, layers=cfg.layers + max(1, cfg.layers // 2))


# ---------------------------------------------------------------------------------------
# Files, cached by mtime: the form asks on every keystroke.

_json_cache: dict[str, tuple[tuple, Any]] = {}


def _stat_key(path: str | Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _cached_json(path: Path) -> Any:
    """The parsed file, re-read only when its mtime, size or inode changed; None if absent or bad."""
    key = _stat_key(path)
    if key is None:
        _json_cache.pop(str(path), None)
        return None
    hit = _json_cache.get(str(path))
    if hit and hit[0] == key:
        return hit[1]
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        value = None
    _json_cache[str(path)] = (key, value)
    return value


def find_manifest(cfg: RunConfig) -> dict | None:
    """The prepared data's manifest for the run: `data_dir`'s when set, else the newest
    folder prepared for exactly the selected constellations. None when nothing is."""
    if cfg.data_dir:
        try:
            return read_manifest(cfg.data_dir)
        except UserError:
            return None
    names = set(cfg.constellations)
    return next((m for _, m in prepared_folders() if set(m["constellations"]) == names), None)


def checkpoint_info(target: str) -> dict | None:
    """{"step", "config", "path"} of the checkpoint a run would continue from, read from
    its sidecar `ckpt_<step>.json` (written by `lab.checkpoint.save`; no torch needed):
    the file itself, or the newest in a run folder or its `checkpoints/`."""
    path = Path(target).expanduser()
    if path.suffix == ".pt":
        sidecars = [path.with_suffix(".json")]
    else:
        sidecars = []
        for folder in (path, path / "checkpoints"):
            try:
                sidecars += sorted(p for p in folder.iterdir() if p.name.startswith("ckpt_") and p.suffix == ".json")
            except OSError:
                pass
    for sidecar in reversed(sidecars):
        meta = _cached_json(sidecar)
        if isinstance(meta, dict) and isinstance(meta.get("step"), int):
            return {"step": meta["step"], "config": meta.get("config") or {}, "path": str(sidecar.with_suffix(".pt"))}
    return None


# ---------------------------------------------------------------------------------------
# The lab's measured runs: tokens/s from runs/<id>/metrics.jsonl


WARMUP_STEPS = 20  # steps at a session's start that compile kernels and fill caches
SPEED_SAMPLES = 1000  # the median is over the most recent steps: the current code's speed
TAIL_BYTES = 64 * 1024  # a first read takes only the end of a long log (~350 steps)
MIN_SPEED_SAMPLES = 5


class _SpeedLog:
    """tok_s values of one metrics.jsonl, read incrementally: a live run appends a line
    per step, and re-reading megabytes on every keystroke would be too slow.

    Only the latest session counts: a continued run's folder starts with the earlier
    sessions' rows, which may come from another card (device.json describes this one)."""

    def __init__(self) -> None:
        self.ino: int | None = None
        self.offset = 0
        self.values: deque = deque(maxlen=SPEED_SAMPLES)
        self.session: Any = None
        self.last_elapsed: float | None = None
        self.segment_start: int | None = None  # first step of the current session
        self.cached_median: float | None = None

    def update(self, path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        tail_read = False
        if st.st_ino != self.ino or st.st_size < self.offset:  # new, replaced or truncated
            self.__init__()
            self.ino = st.st_ino
            if st.st_size > TAIL_BYTES:
                self.offset, tail_read = st.st_size - TAIL_BYTES, True
                # Mid-session: no warm-up to skip until the next session starts.
                self.segment_start = -WARMUP_STEPS
        if st.st_size == self.offset:
            return
        with open(path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(st.st_size - self.offset)
        if tail_read:
            cut = chunk.find(b"\n") + 1  # the first line of a tail read is cut
            chunk, self.offset = chunk[cut:], self.offset + cut
        end = chunk.rfind(b"\n") + 1  # a line being written is read next time
        for line in chunk[:end].splitlines():
            self._add(line)
        self.offset += end
        self.cached_median = None

    def _add(self, line: bytes) -> None:
        try:
            rec = json.loads(line)
            tok_s, step = float(rec["tok_s"]), int(rec["step"])
        except (ValueError, KeyError, TypeError):
            return
        # A new session: the `session` number changes (or, in logs without it, the clock restarts).
        session, elapsed = rec.get("session"), rec.get("elapsed_s")
        restarted = isinstance(elapsed, (int, float)) and self.last_elapsed is not None and elapsed < self.last_elapsed
        if (session is not None and session != self.session and self.session is not None) or restarted:
            self.values.clear()
            self.segment_start = None
        self.session = session
        if isinstance(elapsed, (int, float)):
            self.last_elapsed = float(elapsed)
        if self.segment_start is None:
            self.segment_start = step
        if step - self.segment_start >= WARMUP_STEPS and tok_s > 0:
            self.values.append(tok_s)

    def median(self) -> float | None:
        if len(self.values) < MIN_SPEED_SAMPLES:
            return None
        if self.cached_median is None:
            self.cached_median = _median(self.values)
        return self.cached_median


def _median(values: Iterable[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclass(frozen=True)
class Measured:
    """One of the lab's runs with a steady tokens/s."""
    run: str
    gpu: str
    precision: str
    context: int
    width: int
    heads: int
    layers: int
    vocab: int
    batch_per_card: int
    tok_s: float

    def size_key(self) -> tuple:
        return (self.context, self.width, self.heads, self.layers, self.vocab, self.batch_per_card)

    def flops_per_token(self) -> float:
        return flops_per_token(self.layers, self.width, self.vocab, self.context)


_speed_logs: dict[str, _SpeedLog] = {}
_run_infos: dict[str, tuple[tuple, tuple | None]] = {}


def _run_gpu(cfg: dict, device: dict) -> str | None:
    """Which of CARDS a run ran on: device.json (`lab.train.describe_runtime`: device, name,
    cards, world) when there is one, else the config's gpu unless it was "auto"."""
    if device.get("gpu") in CARDS:
        return device["gpu"]
    if device.get("device") == "cpu":
        return "cpu"
    name = str(device.get("name", ""))
    if name:
        card = card_set(name, max(int(device.get("cards") or 1), int(device.get("world") or 1)))
        return card if card in CARDS else None  # None: a card the calculator has no figures for
    return cfg.get("gpu") if cfg.get("gpu") in CARDS else None


def _run_vocab(cfg: dict, device: dict) -> int:
    """A run's vocab: its config or device.json if they say (RunConfig has no vocab field),
    else its data's manifest, else the default."""
    vocab = cfg.get("vocab") or device.get("vocab")
    if isinstance(vocab, int):
        return vocab
    run_cfg = RunConfig(data_dir=str(cfg.get("data_dir") or ""),
                        constellations=[str(c) for c in cfg.get("constellations") or []])
    return _resolve_vocab(None, find_manifest(run_cfg), None)[0]


def _run_info(folder: str) -> tuple | None:
    """(gpu, precision, context, width, heads, layers, vocab, batch_per_card) of a run
    folder, worked out once per change of its config.json or device.json."""
    cfg_path, dev_path = os.path.join(folder, "config.json"), os.path.join(folder, "device.json")
    key = (_stat_key(cfg_path), _stat_key(dev_path))
    hit = _run_infos.get(folder)
    if hit and hit[0] == key:
        return hit[1]
    cfg, device = _cached_json(Path(cfg_path)), _cached_json(Path(dev_path))
    info = None
    try:
        if isinstance(cfg, dict):
            device = device if isinstance(device, dict) else {}
            gpu = _run_gpu(cfg, device)
            precision = device.get("precision") or cfg.get("precision") or "auto"
            if gpu is not None:
                info = (gpu, CARDS[gpu].precision if precision == "auto" else precision,
                        *(int(cfg.get(k, REFERENCE[k])) for k in ("context", "width", "heads", "layers")),
                        _run_vocab(cfg, device), int(cfg.get("batch_per_card", REFERENCE["batch_per_card"])))
    except (TypeError, ValueError, AttributeError):
        info = None  # a run folder with odd files is left out, not an error
    _run_infos[folder] = (key, info)
    return info


def measured_runs(gpu: str | None = None, root: Path | None = None) -> list[Measured]:
    """The lab's runs in `root` (default `$LAB_HOME/runs`, and each account's probe burst,
    `lab probe`), on `gpu` or all, whose metrics give a steady speed."""
    folders = _scan(runs_dir() if root is None else root)
    if root is None:  # a probe's burst is a run folder too (lab.machines.probe_record)
        folders += [(f"probe:{name}", os.path.join(path, "probe")) for name, path in _scan(accounts_dir())
                    if os.path.isdir(os.path.join(path, "probe"))]
    out = []
    for name, folder in folders:
        info = _run_info(folder)
        if info is None or (gpu is not None and info[0] != gpu):
            continue  # read metrics only for runs that can matter
        log = _speed_logs.setdefault(folder, _SpeedLog())
        log.update(os.path.join(folder, "metrics.jsonl"))
        tok_s = log.median()
        if tok_s is not None:
            out.append(Measured(name, *info, tok_s))
    return out


def _scan(root: Path) -> list[tuple[str, str]]:
    try:
        return [(e.name, e.path) for e in os.scandir(root) if e.is_dir()]
    except OSError:
        return []


# ---------------------------------------------------------------------------------------
# Figures


@dataclass
class Figure:
    value: Any
    kind: str  # exact | measured | calibrated | estimate | unknown
    unit: str = ""
    note: str = ""
    note_ru: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"value": self.value, "kind": self.kind}
        if self.unit:
            d["unit"] = self.unit
        if self.note:
            d["note"], d["note_ru"] = self.note, self.note_ru
        d.update(self.extra)
        return d


def _unknown(why: str, why_ru: str, unit: str = "") -> Figure:
    return Figure(None, "unknown", unit, why, why_ru)


@dataclass
class Estimate:
    """The figures beside the form's fields, and what is wrong with the fields."""
    gpu: str
    gpu_auto: bool
    cards: int
    precision: str
    vocab: int
    vocab_source: str  # given | manifest | checkpoint | default
    weights: Figure
    tokens_per_step: Figure
    tokens_wanted: Figure
    tokens_available: Figure
    epochs: Figure
    tokens_planned: Figure
    tok_s: Figure
    run_hours: Figure
    memory_per_card_gb: Figure
    max_batch_per_card: Figure
    quota_hours: Figure
    problems: list[Problem] = field(default_factory=list)

    FIGURES = ("weights", "tokens_per_step", "tokens_wanted", "tokens_available", "epochs", "tokens_planned",
               "tok_s", "run_hours", "memory_per_card_gb", "max_batch_per_card", "quota_hours")

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def hours_to_finish(self) -> float | None:
        """GPU quota the rest of the run needs (to `steps_until`, start-ups included): what the
        Auto rule compares with each account's quota. None when the fields do not say."""
        q = self.quota_hours
        return None if q.value is None else float(q.extra.get("to_steps_until", q.value))

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity != "error"]

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"gpu": self.gpu, "gpu_auto": self.gpu_auto, "cards": self.cards,
                             "precision": self.precision, "vocab": self.vocab, "vocab_source": self.vocab_source}
        for name in self.FIGURES:
            d[name] = getattr(self, name).to_dict()
        d["errors"] = [_problem_dict(p) for p in self.errors]
        d["warnings"] = [_problem_dict(p) for p in self.warnings]
        return d


def _problem_dict(p: Problem) -> dict:
    return {"field": p.field, "severity": p.severity, "en": p.en, "ru": p.ru}


def _resolve_vocab(vocab: int | None, manifest: dict | None, ckpt: dict | None) -> tuple[int, str]:
    if vocab is not None:
        return int(vocab), "given"
    ckpt_vocab = ((ckpt or {}).get("config") or {}).get("vocab")
    if isinstance(ckpt_vocab, int):
        return ckpt_vocab, "checkpoint"
    mvocab = ((manifest or {}).get("tokenizer") or {}).get("vocab")
    if isinstance(mvocab, int):
        return mvocab, "manifest"
    return DEFAULT_VOCAB, "default"


def _with_checkpoint_model(cfg: RunConfig, ckpt: dict | None, given: set[str] | None) -> RunConfig:
    """A continued run has the checkpoint's architecture: the model fields the person did not
    set are taken from it, so the figures describe the model that will actually train."""
    if not ckpt or given is None:
        return cfg
    theirs = ckpt.get("config") or {}
    return replace(cfg, **{k: theirs[k] for k in MODEL_FIELDS if k not in given and isinstance(theirs.get(k), int)})


def tokens_available(cfg: RunConfig, manifest: dict | None) -> int | None:
    """Training tokens of the selected constellations in the manifest (all of it for a
    `data_dir` run, or when the manifest does not break them down)."""
    if not manifest:
        return None
    per = manifest.get("constellations")
    if isinstance(per, dict) and per and not cfg.data_dir:
        counts = [per[n].get("train_tokens") for n in cfg.constellations if isinstance(per.get(n), dict)]
        counts = [c for c in counts if isinstance(c, int)]
        return sum(counts) if counts else None
    total = manifest.get("train_tokens")
    return total if isinstance(total, int) else None


def _speed(card: Card, cfg: RunConfig, vocab: int, precision: str, runs: list[Measured]) -> Figure:
    """tokens/s: the measurement at this size when there is one, else a FLOP rate (tokens/s
    × FLOPs per token) carried over from measured sizes, divided by this size's FLOPs."""
    flops = flops_per_token(cfg.layers, cfg.width, vocab, cfg.context)
    key = (cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, cfg.batch_per_card)
    own = [r for r in runs if r.gpu == card.name and r.precision == precision]
    if own:
        same = [r for r in own if r.size_key() == key]
        if same:
            names = ", ".join(sorted(r.run for r in same))
            return Figure(round(_median(r.tok_s for r in same)), "measured", "tokens/s",
                          f"median of the lab's runs at this size on {card.name}: {names}",
                          f"медиана прогонов лабы этого размера на {card.name}: {names}")
        rate, used = _interpolated_rate(own, flops)
        return Figure(round(rate / flops), "calibrated", "tokens/s",
                      f"scaled by FLOPs per token from the lab's runs on {card.name}: {used}",
                      f"пересчитано по FLOPs на токен от прогонов лабы на {card.name}: {used}")
    ref = REFERENCE
    ref_flops = flops_per_token(ref["layers"], ref["width"], ref["vocab"], ref["context"])
    tok_s = reference_tok_s(card) * ref_flops / flops
    at_ref = key == tuple(ref[k] for k in ("context", "width", "heads", "layers", "vocab", "batch_per_card"))
    if card.ref_measured and at_ref and precision == card.precision:
        return Figure(round(tok_s), "measured", "tokens/s", f"the guide's measurement on {card.name}",
                      f"замер из гайда на {card.name}")
    basis = "the guide's measurement" if card.ref_measured else "the lab's rough guess"
    basis_ru = "замера из гайда" if card.ref_measured else "грубой прикидки лабы"
    other = precision != card.precision  # not corrected for: measure a short run instead
    return Figure(round(tok_s), "estimate", "tokens/s",
                  f"scaled by FLOPs per token (6·N + 12·layers·n·d) from {basis} on {card.name} at the reference size"
                  + (f", in {card.precision}: {precision} will be slower" if other else ""),
                  f"пересчитано по FLOPs на токен (6·N + 12·слои·n·d) от {basis_ru} на {card.name} "
                  f"для эталонного размера" + (f", в {card.precision}: {precision} будет медленнее" if other else ""))


def _interpolated_rate(runs: list[Measured], flops: float) -> tuple[float, str]:
    """FLOP rate at `flops`: interpolated in log-log between the nearest measured sizes
    below and above, or the nearest one's rate outside their range. Small models reach a
    lower rate than big ones, so this beats a single reference."""
    by_size: dict[float, list[Measured]] = {}
    for r in runs:
        by_size.setdefault(r.flops_per_token(), []).append(r)
    points = sorted((f, _median(r.tok_s * f for r in rs), rs) for f, rs in by_size.items())
    below = [p for p in points if p[0] <= flops]
    above = [p for p in points if p[0] >= flops]
    if below and above and below[-1][0] != above[0][0]:
        (f0, r0, rs0), (f1, r1, rs1) = below[-1], above[0]
        w = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
        rate, used = math.exp(math.log(r0) + w * (math.log(r1) - math.log(r0))), rs0 + rs1
    else:
        f, rate, used = min(points, key=lambda p: abs(math.log(p[0] / flops)))
    return rate, ", ".join(sorted({r.run for r in used}))


def _eval_share(cfg: RunConfig) -> float:
    """Time spent on val evaluations, as a fraction of training time."""
    if cfg.eval_every < 1 or cfg.grad_accum < 1:
        return 0.0
    return cfg.eval_batches * EVAL_FORWARD_SHARE / (cfg.eval_every * cfg.grad_accum)


def _sizes_ok(cfg: RunConfig, vocab: int) -> bool:
    return min(cfg.context, cfg.width, cfg.heads, cfg.layers, cfg.batch_per_card, cfg.grad_accum, vocab) >= 1


def estimate(cfg: RunConfig, vocab: int | None = None, manifest: dict | None = None,
             checkpoint: dict | None = None, given: set[str] | None = None,
             runs: list[Measured] | None = None) -> Estimate:
    """Every figure for the run, and every problem with its fields. Never raises on bad
    fields (the form calls it with half-typed values): figures it cannot compute are
    "unknown" and the errors say why.

    manifest: the prepared data's manifest; None looks it up (`data_dir` or the
    constellations). checkpoint: {"step", "config"}; None reads `resume_from`'s sidecar.
    given: fields the person set explicitly (a resumed run takes the others from the
    checkpoint; a given model field that differs is an error). runs: measured runs; None
    scans `$LAB_HOME/runs` and the accounts' probes."""
    if manifest is None:
        manifest = find_manifest(cfg)
    ckpt_missing = False
    if checkpoint is None and cfg.resume_from:
        checkpoint = checkpoint_info(cfg.resume_from)
        ckpt_missing = checkpoint is None
    vocab_n, vocab_source = _resolve_vocab(vocab, manifest, checkpoint)
    run_cfg = _with_checkpoint_model(cfg, checkpoint, given)
    gpu_auto = cfg.gpu == "auto"
    card = CARDS.get(AUTO_GPU if gpu_auto else cfg.gpu)
    precision = (cfg.precision if cfg.precision not in ("auto", "") else card.precision) if card else "fp16"
    if runs is None:
        runs = measured_runs(card.name) if card else []

    est = Estimate(card.name if card else cfg.gpu, gpu_auto, card.cards if card else 1, precision, vocab_n,
                   vocab_source, **{name: _unknown("fix the fields first", "сначала исправьте поля")
                                    for name in Estimate.FIGURES})
    if _sizes_ok(run_cfg, vocab_n):
        _size_figures(est, run_cfg, manifest)
        if card is not None:
            steps = max(0, run_cfg.steps_until - (checkpoint["step"] if checkpoint else 0))
            _step_figures(est, run_cfg, card, steps)
            _time_figures(est, run_cfg, card, runs, steps)
            _memory_figures(est, run_cfg, card)
    est.problems = _problems(cfg, run_cfg, est, card, vocab, manifest, checkpoint, ckpt_missing, given)
    return est


def _size_figures(est: Estimate, cfg: RunConfig, manifest: dict | None) -> None:
    """Weights, and the data they want against the data there is."""
    n_weights = weight_count(cfg.layers, cfg.width, est.vocab, cfg.context)
    est.weights = Figure(n_weights, "exact", "weights", "12·layers·d² + vocab·d + n·d",
                         "12·слои·d² + словарь·d + n·d")
    wanted = TOKENS_PER_WEIGHT * n_weights
    est.tokens_wanted = Figure(wanted, "estimate", "tokens", f"about {TOKENS_PER_WEIGHT} tokens per weight",
                               f"около {TOKENS_PER_WEIGHT} токенов на вес")
    available = tokens_available(cfg, manifest)
    if not available:
        est.tokens_available = _unknown("no prepared data for these constellations (lab prepare)",
                                        "для этих созвездий нет подготовленных данных (lab prepare)", "tokens")
        est.epochs = _unknown("data size unknown", "объём данных неизвестен", "epochs")
        return
    est.tokens_available = Figure(available, "exact", "tokens", "train tokens in the manifest",
                                  "токенов обучения в манифесте")
    est.epochs = Figure(round(wanted / available, 2), "estimate", "epochs",
                        "passes over the data that the tokens wanted imply",
                        "сколько проходов по данным нужно на желаемые токены")


def _step_figures(est: Estimate, cfg: RunConfig, card: Card, steps: int) -> None:
    """Tokens per optimizer step, and to steps_until."""
    per_step = cfg.batch_per_card * card.cards * cfg.context * cfg.grad_accum
    accum = f" × grad_accum {cfg.grad_accum}" if cfg.grad_accum != 1 else ""
    est.tokens_per_step = Figure(per_step, "exact", "tokens",
                                 f"batch {cfg.batch_per_card} × {card.cards} card(s) × n {cfg.context}{accum}",
                                 f"батч {cfg.batch_per_card} × карт {card.cards} × n {cfg.context}{accum}")
    planned = steps * per_step
    extra = {"epochs": round(planned / est.tokens_available.value, 2)} if est.tokens_available.value else {}
    est.tokens_planned = Figure(planned, "exact", "tokens", f"{steps} steps × {per_step} tokens",
                                f"{steps} шагов × {per_step} токенов", extra)


def _time_figures(est: Estimate, cfg: RunConfig, card: Card, runs: list[Measured], steps: int) -> None:
    """Speed, the run's hours (capped by the limit) and the quota they spend."""
    est.tok_s = speed = _speed(card, cfg, est.vocab, est.precision, runs)
    if not speed.value:
        return
    eval_share = _eval_share(cfg)
    step_s = est.tokens_per_step.value / speed.value * (1 + eval_share)
    hours_to_end = steps * step_s / 3600
    limit_h = cfg.limit_min / 60 if cfg.limit_min > 0 else math.inf
    run_h = min(hours_to_end, limit_h)
    capped = hours_to_end > limit_h
    sessions = math.ceil(hours_to_end / limit_h) if steps and limit_h < math.inf else (1 if steps else 0)
    est.run_hours = Figure(round(run_h, 3), speed.kind, "hours",
                           f"{steps} steps at {speed.value} tokens/s, val evaluations +{eval_share:.1%}"
                           + (f"; the limit stops it at ~{int(limit_h * 3600 / step_s)} steps" if capped else ""),
                           f"{steps} шагов при {speed.value} токенов/с, оценки val +{eval_share:.1%}"
                           + (f"; лимит остановит около {int(limit_h * 3600 / step_s)} шагов" if capped else ""),
                           {"to_steps_until": round(hours_to_end, 3), "capped_by_limit": capped,
                            "steps_in_limit": int(limit_h * 3600 / step_s) if capped else steps,
                            "sessions": sessions})
    if not card.kaggle:
        est.quota_hours = Figure(0.0, "exact", "hours", "a local card spends no Kaggle quota",
                                 "своя карта не тратит квоту Kaggle", {"to_steps_until": 0.0})
        return
    overhead = STARTUP_MIN / 60
    est.quota_hours = Figure(round(run_h + overhead, 3) if steps else 0.0, speed.kind, "hours",
                             f"run time + {STARTUP_MIN:g} min for the session's start and the final save; "
                             f"2×T4 costs the same per hour as one GPU",
                             f"время прогона + {STARTUP_MIN:g} мин на запуск сессии и последнее сохранение; "
                             f"час 2×T4 стоит как час одной GPU",
                             {"to_steps_until": round(hours_to_end + sessions * overhead, 3)})


def _memory_figures(est: Estimate, cfg: RunConfig, card: Card) -> None:
    """Memory per card at this batch, and the largest batch that fits."""
    precision, vocab = est.precision, est.vocab
    mem = memory_bytes(cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, cfg.batch_per_card,
                       precision, card.cards, card.context_gb)
    usable = usable_bytes(card)
    usable_gb = None if usable is None else round(usable / GB, 1)
    est.memory_per_card_gb = Figure(round(mem.total / GB, 2), "estimate", "GB",
                                    "weights+grads+AdamW 16·N, 16-bit copies, saved activations (SDPA), "
                                    "logits, 10% slack, CUDA context (formula in lab.sizing.memory_bytes)",
                                    "веса+градиенты+AdamW 16·N, 16-битные копии, активации (SDPA), логиты, "
                                    "10% запаса, контекст CUDA (формула в lab.sizing.memory_bytes)",
                                    {"usable_gb": usable_gb, "parts": mem.parts_gb()})
    if usable is None:
        est.max_batch_per_card = _unknown("this computer's memory is unknown", "объём памяти неизвестен")
        return
    best = max_batch(cfg.context, cfg.width, cfg.heads, cfg.layers, vocab, usable, precision, card.cards,
                     card.context_gb)
    est.max_batch_per_card = Figure(best, "estimate", "sequences",
                                    f"largest batch per card within {usable_gb:g} GB",
                                    f"наибольший батч на карту в пределах {usable_gb:g} ГБ")


# ---------------------------------------------------------------------------------------
# Validation


def validate(cfg: RunConfig, manifest: dict | None = None, checkpoint: dict | None = None,
             given: set[str] | None = None, vocab: int | None = None) -> list[Problem]:
    """Everything wrong with a run's fields, in English and Russian: the field checks of
    `lab.config.check`, the context against the data, the locked fields and steps of a
    continued run, and whether the batch fits the card. Errors refuse the launch;
    warnings are shown before it."""
    return estimate(cfg, vocab=vocab, manifest=manifest, checkpoint=checkpoint, given=given).problems


def _problems(cfg: RunConfig, run_cfg: RunConfig, est: Estimate, card: Card | None, vocab_given: int | None,
              manifest: dict | None, checkpoint: dict | None, ckpt_missing: bool,
              given: set[str] | None) -> list[Problem]:
    out = check(run_cfg)
    if est.vocab < 1:
        out.append(Problem("vocab", f"vocab must be at least 1 (got {est.vocab})",
                           f"словарь должен быть не меньше 1 (сейчас {est.vocab})"))
    out += _data_problems(run_cfg, est, manifest, vocab_given)
    if cfg.resume_from:
        if ckpt_missing:
            out.append(Problem("resume_from", f"no finished checkpoint at {cfg.resume_from}: give a ckpt_*.pt "
                                              f"file or a run folder that has one",
                               f"в {cfg.resume_from} нет готового чекпоинта: укажите файл ckpt_*.pt "
                               f"или папку прогона с ним"))
        elif checkpoint is not None:
            theirs = checkpoint.get("config") or cfg.model_dict()  # no config saved: nothing to lock against
            out += check_resume(cfg, theirs, int(checkpoint["step"]), given)
    if card is not None and card.precision == "fp16" and est.precision == "bf16":
        out.append(Problem("precision", f"{card.name} has no native bf16: it is emulated and slow; "
                                        f"use precision auto (fp16 + GradScaler)",
                           f"у {card.name} нет настоящего bf16: он эмулируется и медленный; "
                           f"выберите precision auto (fp16 + GradScaler)", severity="warning"))
    out += _fit_problems(run_cfg, est, card)
    return out


def _data_problems(cfg: RunConfig, est: Estimate, manifest: dict | None, vocab_given: int | None) -> list[Problem]:
    out: list[Problem] = []
    if manifest is None:
        names = ", ".join(cfg.constellations) or cfg.data_dir
        out.append(Problem("constellations", f"no prepared data for {names}: tokens available are unknown; "
                                             f"run `lab prepare` first",
                           f"для {names} нет подготовленных данных: сколько токенов, неизвестно; "
                           f"сначала `lab prepare`", severity="warning"))
        return out
    per = manifest.get("constellations")
    if isinstance(per, dict) and per and not cfg.data_dir:
        missing = [n for n in cfg.constellations if n not in per]
        if missing:
            out.append(Problem("constellations", f"not in the prepared data: {', '.join(missing)}; "
                                                 f"prepare them with `lab prepare`",
                               f"нет в подготовленных данных: {', '.join(missing)}; подготовьте их `lab prepare`"))
    shortest = manifest.get("shortest_val_tokens")
    if isinstance(shortest, int) and cfg.context >= 1:
        out += check_against_data(cfg, shortest)
    mvocab = (manifest.get("tokenizer") or {}).get("vocab")
    if vocab_given is not None and isinstance(mvocab, int) and mvocab != vocab_given:
        out.append(Problem("vocab", f"vocab {vocab_given} differs from the prepared data's tokenizer ({mvocab})",
                           f"словарь {vocab_given} не совпадает с токенизатором данных ({mvocab})",
                           severity="warning"))
    wanted, available = est.tokens_wanted.value, est.tokens_available.value
    if wanted and available and wanted > available:
        fits = available / TOKENS_PER_WEIGHT
        out.append(Problem("layers", f"the model is bigger than the data can train: {format_count(est.weights.value)} weights "
                                     f"want ≈ {format_count(wanted)} tokens ({TOKENS_PER_WEIGHT} per weight), the data hold "
                                     f"{format_count(available)} ({est.epochs.value:g} epochs). It will be undertrained: "
                                     f"pick a size up to ~{format_count(fits)} weights or add data",
                           f"модель больше, чем данные могут обучить: {format_count(est.weights.value, 'ru')} весов хотят "
                           f"≈ {format_count(wanted, 'ru')} токенов ({TOKENS_PER_WEIGHT} на вес), а в данных "
                           f"{format_count(available, 'ru')} (эпох: {format_number(est.epochs.value, 'ru')}). Она недообучится: "
                           f"возьмите размер до ~{format_count(fits, 'ru')} весов или добавьте данных", severity="warning"))
    return out


def _fit_problems(cfg: RunConfig, est: Estimate, card: Card | None) -> list[Problem]:
    mem, best = est.memory_per_card_gb, est.max_batch_per_card
    if card is None or best.value is None or cfg.batch_per_card <= best.value:
        return []  # the same formula decides both, so the warning and the largest batch agree
    usable = mem.extra["usable_gb"]
    where, where_ru = CARD_WHERE[card.name]
    need, have = f"≈ {mem.value:g} GB", f"{usable:g} GB"
    need_ru, have_ru = f"≈ {format_number(mem.value, 'ru')} ГБ", f"{format_number(usable, 'ru')} ГБ"
    if best.value == 0:
        return [Problem("batch_per_card",
                        f"the model does not fit on {where} even at batch 1 ({need} at batch {cfg.batch_per_card}, "
                        f"{have} usable): lower width, layers or context",
                        f"модель не помещается даже с батчем 1 ({need_ru} при батче {cfg.batch_per_card}, "
                        f"доступно {have_ru} {where_ru}): уменьшите d, слои или контекст", severity="warning")]
    return [Problem("batch_per_card",
                    f"batch {cfg.batch_per_card} per card needs {need}, more than the {have} usable on {where}: "
                    f"out of memory is likely. Lower batch_per_card to {best.value} or less "
                    f"(raise grad_accum to keep the tokens per step)",
                    f"батч {cfg.batch_per_card} на карту требует {need_ru}, больше {have_ru}, доступных {where_ru}: "
                    f"вероятна нехватка памяти. Уменьшите батч до {best.value} или меньше "
                    f"(увеличьте grad_accum, чтобы сохранить токены на шаг)", severity="warning")]


# ---------------------------------------------------------------------------------------
# When to grow

MIN_EVALS = 5  # fewer val points say nothing about a trend
RECENT_SHARE = 1 / 3  # "recent": the last third of the tokens seen on this val set
MIN_RECENT_EVALS = 4
NOISE_FLOOR = 0.005  # nats: a fall smaller than this over the recent tokens is no fall


@dataclass
class Verdict:
    grow: bool
    reason_en: str
    reason_ru: str
    plateau: bool | None = None
    data_suffices: bool | None = None
    fall: float | None = None  # val fall over the recent tokens (nats; positive = still falling)
    noise: float | None = None  # what counts as no fall: 2 standard errors of the fitted slope, or the floor
    recent_tokens: int | None = None
    next_size: dict | None = None
    next_weights: int | None = None
    next_tokens_wanted: int | None = None
    tokens_available: int | None = None

    def reason(self, lang: str = "en") -> str:
        return self.reason_ru if lang == "ru" else self.reason_en

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _val_points(metrics: list[dict]) -> list[tuple[float, float]]:
    """(tokens, val_loss) on the latest val set: new data starts val's count again."""
    points = [(r.get("tokens", r.get("step")), r["val_loss"], r.get("val_set")) for r in metrics
              if isinstance(r.get("val_loss"), (int, float))
              and isinstance(r.get("tokens", r.get("step")), (int, float))]
    if not points:
        return []
    last_set = points[-1][2]
    return [(float(t), float(v)) for t, v, s in points if s == last_set]


def _fall_and_noise(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares slope of val over the recent tokens, as the fall over that window, and
    its noise (2 standard errors of the slope over the window, at least NOISE_FLOOR)."""
    first, last = points[0][0], points[-1][0]
    recent = [p for p in points if p[0] >= last - RECENT_SHARE * (last - first)]
    if len(recent) < MIN_RECENT_EVALS:
        recent = points[-MIN_RECENT_EVALS:]
    xs, ys = [p[0] for p in recent], [p[1] for p in recent]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    span = xs[-1] - xs[0]
    if sxx == 0 or span == 0:
        return 0.0, NOISE_FLOOR, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(resid / max(1, len(xs) - 2) / sxx)
    return -slope * span, max(2 * se * span, NOISE_FLOOR), span


def when_to_grow(metrics: list[dict], manifest: dict | None = None, cfg: RunConfig | None = None,
                 vocab: int | None = None) -> Verdict:
    """The guide's advice decided from numbers: grow when val has reached a plateau (its
    fall over the recent tokens is within noise) and the data suffice for the next size
    up (20 tokens per weight); while val still falls, training longer is cheaper."""
    cfg = cfg or RunConfig()
    vocab_n, _ = _resolve_vocab(vocab, manifest, None)
    nxt = next_size(cfg)
    nxt_weights = weight_count(nxt.layers, nxt.width, vocab_n, nxt.context)
    nxt_wanted = TOKENS_PER_WEIGHT * nxt_weights
    available = tokens_available(cfg, manifest)
    base = dict(next_size=nxt.model_dict(), next_weights=nxt_weights, next_tokens_wanted=nxt_wanted,
                tokens_available=available)
    points = _val_points(metrics)
    if len(points) < MIN_EVALS:
        return Verdict(False, f"only {len(points)} val evaluation(s) on this val set (need {MIN_EVALS}): train on",
                       f"оценок val на этой выборке пока {len(points)}, нужно не меньше {MIN_EVALS}: учите дальше",
                       **base)
    fall, noise, span = _fall_and_noise(points)
    base.update(fall=round(fall, 4), noise=round(noise, 4), recent_tokens=int(span))
    window_en, window_ru = f"over the last {format_count(span)} tokens", f"за последние {format_count(span, 'ru')} токенов"
    if fall > noise:
        return Verdict(False, f"val still falls: {fall:.3f} {window_en} (noise ±{noise:.3f}); "
                              f"training longer is cheaper than growing",
                       f"val ещё падает: на {format_number(round(fall, 3), 'ru')} {window_ru} "
                       f"(шум ±{format_number(round(noise, 3), 'ru')}); дешевле учить дольше, чем растить модель",
                       plateau=False, **base)
    change = f"{-fall:+.3f}"
    plateau_en = f"val is on a plateau (it changed by {change} {window_en}, within noise ±{noise:.3f})"
    plateau_ru = (f"val вышел на плато (изменился на {change.replace('.', ',')} {window_ru}, "
                  f"в пределах шума ±{format_number(round(noise, 3), 'ru')})")
    nxt_en = f"the next size up ({nxt.layers} layers, {format_count(nxt_weights)} weights) wants ≈ {format_count(nxt_wanted)} tokens"
    nxt_ru = (f"следующему размеру (слоёв: {nxt.layers}, весов: {format_count(nxt_weights, 'ru')}) нужно "
              f"≈ {format_count(nxt_wanted, 'ru')} токенов")
    if available is None:
        return Verdict(False, f"{plateau_en}, but the data size is unknown: {nxt_en}; prepare the data to decide",
                       f"{plateau_ru}, но объём данных неизвестен: {nxt_ru}; подготовьте данные, чтобы решить",
                       plateau=True, **base)
    if available < nxt_wanted:
        return Verdict(False, f"{plateau_en}, but {nxt_en} and the data hold {format_count(available)}: add data before growing",
                       f"{plateau_ru}, но {nxt_ru}, а в данных {format_count(available, 'ru')}: сначала добавьте данных",
                       plateau=True, data_suffices=False, **base)
    return Verdict(True, f"{plateau_en} and the data ({format_count(available)} tokens) suffice: {nxt_en}. Grow",
                   f"{plateau_ru}, и данных ({format_count(available, 'ru')} токенов) хватает: {nxt_ru}. Пора расти",
                   plateau=True, data_suffices=True, **base)


# ---------------------------------------------------------------------------------------
# Numbers in words


def format_number(x: float, lang: str = "en") -> str:
    """1234567 -> "1,234,567" (en) or "1 234 567" (ru); decimals with a comma in Russian."""
    text = f"{x:,}" if isinstance(x, int) else f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"
    return text.replace(",", " ").replace(".", ",") if lang == "ru" else text


def format_count(x: float, lang: str = "en") -> str:
    """Token and weight counts in millions or billions: "27.7 M" / "27,7 млн", "1.56 B" / "1,56 млрд"."""
    value, en, ru = (x / 1e9, "B", "млрд") if x >= 1e9 else (x / 1e6, "M", "млн")
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return f"{text.replace('.', ',')} {ru}" if lang == "ru" else f"{text} {en}"
