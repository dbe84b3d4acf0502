"""A whole run's time: its steps at the speed model's step time, and what each session spends
besides steps (evaluations and their text samples, checkpoints, compiling, and a session's
start and end: on Kaggle the boot, data mount and output copy). One figure, the whole run's
seconds, feeds the calculator's time, its Kaggle quota and Auto's "covers the whole run"."""
from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass

from lab.config import RunConfig, flops_per_token, weight_count
from lab.kaggle.sessions import session_overheads
from lab.sizing.cards import STARTUP_MIN, Card
from lab.sizing.speedmodel import SpeedModel, size_of

EVAL_FORWARD_SHARE = 1 / 3  # an eval batch is a forward only: a third of a training micro-step
SAMPLE_TOKENS = 48  # the text sample at each evaluation (lab.kernel.train.Trainer.sample)
# A checkpoint save: weights, AdamW's two moments and the fp32 copies, at ~200 MB/s (the
# training loop's own first guess before it has timed one).
SAVE_FIXED_S, SAVE_BYTES_PER_WEIGHT, SAVE_BYTES_PER_S = 0.5, 16, 200e6
# Compiling the training and evaluation graphs, once per session. CPU: about 16 s cold on two
# cores (docs/speed.md). GPU: unmeasured, a guess.
COMPILE_S = {"cpu": 16.0, "gpu": 60.0}
# Mirrors lab.kernel.speed.COMPILE_MIN_FLOPS_CPU (the kernel side imports torch; a test keeps
# the two equal): auto compiles on CPU only for a run of at least this many training FLOPs.
CPU_COMPILE_MIN_FLOPS = 1.5e13
# A session on this computer besides its steps: the notebook's kernel, Python, torch, the model,
# the data. Measured: `lab run --machine local` of one step (4 layers, d 128) took 5.3-5.5 s end
# to end on the idle 2-vCPU VM the kit is developed on, 2026-12-01 (about 10 s when other work
# shared it); a guess for other machines.
LOCAL_START_S = 5.5


@dataclass(frozen=True)
class SessionCosts:
    """What a session spends outside its training loop's clock."""
    start_s: float  # before the first step: boot, data mount, imports, building the model
    end_s: float  # after the last save: copying the outputs out
    note: str
    note_ru: str


def kaggle_session_costs(account: str | None = None) -> SessionCosts:
    """A Kaggle session's boot and inputs check, and its output copy: the medians of what the
    account's last sessions measured (`lab.kaggle.sessions.session_overheads`); until
    the account has them (or for Auto, before it picks one), the kit's constant."""
    seen = session_overheads(account) if account else None
    if seen and seen.get("boot_s") is not None:
        start = seen["boot_s"] + (seen.get("data_checks_s") or 0.0)
        end = seen.get("output_copy_s") or 0.0
        n = seen["sessions"]
        return SessionCosts(start, end, f"{start / 60:.1f} min per session to start and {end / 60:.1f} to copy "
                            f"the outputs, as {n} session(s) of {account} measured",
                            f"{start / 60:.1f} мин на запуск сессии и {end / 60:.1f} на копирование результатов, "
                            .replace(".", ",") + f"по замеру {n} сессий {account}")
    return SessionCosts(STARTUP_MIN * 60, 0.0, f"{STARTUP_MIN:g} min per Kaggle session for its start, data mount "
                        f"and output copy, the kit's constant",
                        f"{STARTUP_MIN:g} мин на сессию Kaggle на запуск, данные и копирование результатов, "
                        f"константа кита")


def local_session_costs() -> SessionCosts:
    return SessionCosts(LOCAL_START_S, 0.0, f"~{LOCAL_START_S:g} s per session to start",
                        f"~{LOCAL_START_S:g} с на запуск сессии")


def compiles(cfg: RunConfig, card: Card, vocab: int, steps: int) -> bool:
    """Whether the run's sessions will compile the model (lab.kernel.speed.compile_choice)."""
    if cfg.torch_compile in ("on", "off"):
        return cfg.torch_compile == "on"
    if card.name != "cpu":
        return True
    work = flops_per_token(cfg.layers, cfg.width, vocab, cfg.context) * cfg.batch_per_card * cfg.context \
        * cfg.grad_accum * steps
    return work >= CPU_COMPILE_MIN_FLOPS and shutil.which(os.environ.get("CXX") or "g++") is not None


@dataclass(frozen=True)
class RunTime:
    """A run's seconds by what they are spent on; `total_s` is the whole run."""
    steps: int
    step_s: float
    train_s: float
    evals_s: float  # evaluations and their text samples
    saves_s: float
    compile_s: float  # all sessions together
    sessions_s: float  # the sessions' starts and ends
    sessions: int
    longest_session_s: float

    @property
    def total_s(self) -> float:
        return self.train_s + self.evals_s + self.saves_s + self.compile_s + self.sessions_s

    @property
    def steps_per_session(self) -> int:
        return math.ceil(self.steps / self.sessions) if self.sessions else 0


def run_time(model: SpeedModel, cfg: RunConfig, vocab: int, steps: int, costs: SessionCosts,
             compiled: bool, tok_s: float | None = None) -> RunTime:
    """The run's `steps` remaining steps, in sessions of at most `limit_min` each; `tok_s`: the
    speed the calculator shows (a measurement at this size), else the model's."""
    card = model.card
    size = size_of(cfg, vocab, card)
    step_s = size.tokens_per_step / tok_s if tok_s else model.step_s(size)
    train_s = steps * step_s
    evals = steps // cfg.eval_every + 1 if steps and cfg.eval_every >= 1 else 0
    eval_s = cfg.eval_batches * EVAL_FORWARD_SHARE * model.step_s(size_of(cfg, vocab, card, grad_accum=1))
    sample_s = SAMPLE_TOKENS * EVAL_FORWARD_SHARE * model.step_s(
        size_of(cfg, vocab, card, batch_per_card=1, grad_accum=1, cards=1, context=min(cfg.context, SAMPLE_TOKENS)))
    evals_s = evals * (eval_s + sample_s)
    save_s = SAVE_FIXED_S + weight_count(cfg.layers, cfg.width, vocab, cfg.context) * SAVE_BYTES_PER_WEIGHT \
        / SAVE_BYTES_PER_S
    compile_once = COMPILE_S["cpu" if card.name == "cpu" else "gpu"] if compiled else 0.0
    work = train_s + evals_s
    work += work / (cfg.checkpoint_every_min * 60) * save_s if cfg.checkpoint_every_min > 0 else 0.0
    budget = max(cfg.limit_min * 60 - compile_once - save_s, 60.0) if cfg.limit_min > 0 else math.inf
    sessions = max(1, math.ceil(work / budget)) if steps else 0
    per_session = compile_once + save_s + costs.start_s + costs.end_s
    return RunTime(steps, step_s, train_s, evals_s, work - train_s - evals_s + sessions * save_s,
                   sessions * compile_once, sessions * (costs.start_s + costs.end_s), sessions,
                   (min(budget, work) + per_session) if steps else 0.0)
