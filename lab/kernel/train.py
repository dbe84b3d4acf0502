"""The training loop: one process, DDP under torchrun, or DataParallel.

Read it top to bottom: pick the device and precision, open the data, build or restore
the model and optimizer, then the step — forward under autocast, scaled backward,
unscale, clip, step — with logging, evaluation, periodic checkpoints and the time-limit
saver around it.
"""
from __future__ import annotations

import json
import os
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from lab.kernel.checkpoint import (FORMAT, CheckpointError, CheckpointSaveError, StopGuard, checkpoint_step,
                                   load_checkpoint, newest_whole_checkpoint, resolve_checkpoint, save_checkpoint)
from lab.config import (RunConfig, card_set, check, check_against_data, check_resume, cpu_precision, fields_off_defaults,
                        flops_per_token, raise_on_errors, resumed_config)
from lab.kernel.data import Prefetcher, TokenData
from lab.kernel.launch import COLLECTIVE_TIMEOUT_MIN
from lab.kernel.metrics import echo_metrics, metrics_lines, write_metrics_lines
from lab.kernel.model import GPT
from lab.kernel.schedule import lr_for_config
from lab.kernel.speed import (Readings, compile_choice, compile_or_eager, next_sync_steps, trial_context,
                              wrap_ddp)


@dataclass
class Runtime:
    """Where this process trains: its rank among `world` processes, device, precision and cards."""
    rank: int
    world: int
    device: torch.device
    precision: str
    cards: int  # cards one optimizer step spans: world under DDP, the GPUs under DataParallel
    data_parallel: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


def pick_precision(device: torch.device, requested: str = "auto") -> str:
    """On CUDA, bf16 from compute capability 8.0 (Ampere) on, else fp16; on a CPU, bf16 where
    it multiplies bf16 in hardware, else fp32 (`config.cpu_precision`).

    `torch.cuda.is_bf16_supported()` says True on a T4 (7.5), where bf16 is emulated and
    slow, so the capability decides.
    """
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return cpu_precision()
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"


def setup_runtime(cfg: RunConfig) -> Runtime:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        if not dist.is_initialized():
            # A rank left waiting in a collective (its peer crashed or hangs) fails within minutes.
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=timedelta(minutes=COLLECTIVE_TIMEOUT_MIN))
        return Runtime(rank, world, device, pick_precision(device, cfg.precision), cards=world)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    gpus = torch.cuda.device_count()
    use_dp = cfg.parallel == "dp" and gpus > 1
    return Runtime(0, 1, device, pick_precision(device, cfg.precision), cards=gpus if use_dp else 1,
                   data_parallel=use_dp)


def autocast(rt: Runtime):
    if rt.precision == "fp32":
        return nullcontext()
    dtype = torch.float16 if rt.precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=rt.device.type, dtype=dtype)


def make_optimizer(model: nn.Module, cfg: RunConfig, device: torch.device) -> torch.optim.AdamW:
    # Decay matrices and embeddings, not vectors (this model has none, but a variant might).
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    # Fused: one kernel for all weights, and under GradScaler no host sync to check for inf.
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, **fused)


def rng_state() -> dict:
    """This process's RNG states as tensors and plain values (a checkpoint loads as data)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    # Format 1 kept NumPy's own array; format 2 a tensor of the same keys.
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys
    np.random.set_state((name, keys.astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def all_ranks(obj, rt: Runtime) -> list:
    if rt.world == 1:
        return [obj]
    out = [None] * rt.world
    dist.all_gather_object(out, obj)
    return out


def agree(values: list[float], rt: Runtime) -> list[float]:
    """Sums small numbers across ranks (losses, stop flags) in one collective."""
    t = torch.tensor(values, dtype=torch.float64, device=rt.device if rt.device.type == "cuda" else "cpu")
    sum_ranks(t, rt)
    return t.tolist()


def sum_ranks(t: torch.Tensor, rt: Runtime) -> None:
    """Sums `t` across ranks in place (nothing to do in one process)."""
    if rt.world > 1:
        dist.all_reduce(t)


class OutOfMemory(RuntimeError):
    """The batch does not fit the card; the message says which batch does."""


def largest_fitting(fits: Callable[[int], bool], upper: int) -> int:
    """The largest b in [0, upper] with fits(b), assuming fits is monotone (0 always fits)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


class Trainer:
    def __init__(self, cfg: RunConfig, out_dir: str | os.PathLike, data_dir: str | os.PathLike,
                 resume: str | os.PathLike | None = None, allow_fallback: bool = False,
                 given: set[str] | None = None, log: Callable[[str], None] = print,
                 on_metrics: Callable[[dict], None] | None = None, started: float | None = None,
                 stop_file: str | os.PathLike | None = None):
        self.cfg, self.out = cfg, Path(out_dir)
        self.log_fn, self.on_metrics, self.started, self.stop_file = log, on_metrics, started, stop_file
        self.data = TokenData(data_dir)
        self.ckpt = self._load_resume(resume, allow_fallback, given)
        cfg = self.cfg  # a resumed run's: as it was, with what was given now
        self.rt = setup_runtime(cfg)
        if self.ckpt is not None:
            self.log(f"resuming from {self.resume_path} at step {self.ckpt['step']:,}")
        raise_on_errors(check(cfg) + check_against_data(cfg, self.data.shortest_split))
        if self.ckpt is None and (self.out / "metrics.jsonl").exists():
            raise CheckpointError(f"{self.out} already holds a run (metrics.jsonl): continue it with "
                                  f"--resume {self.out}, or choose another --out")
        self._build()

    # --- setup -------------------------------------------------------------------------
    def log(self, text: str) -> None:
        if self.rt.main:
            self.log_fn(text)

    def _load_resume(self, resume, allow_fallback, given) -> dict | None:
        if not resume:
            return None
        path = resolve_checkpoint(resume, allow_fallback)
        state = load_checkpoint(path)
        if given is None:  # from a notebook: fields that differ from the defaults were given
            given = fields_off_defaults(self.cfg)
        # The run as it was, with what was given now on top (the model fields locked).
        self.cfg = resumed_config(state["config"], {name: getattr(self.cfg, name) for name in given})
        raise_on_errors(check_resume(self.cfg, state["config"], state["step"], given))
        if state["tokenizer_sha256"] != self.data.manifest["tokenizer"]["sha256"]:
            raise CheckpointError(
                "the data was tokenized with another tokenizer than the checkpoint's: prepare the data with "
                "constellations that include the checkpoint's, so `lab prepare` reuses its tokenizer")
        self.resume_path = path
        return state

    def _continue_metrics(self, ckpt_path: Path, step: int) -> None:
        """Makes the run folder's metrics end at the checkpoint's step, so the curve reads as
        one line: rows a killed session logged after its last checkpoint are dropped, and a
        fresh folder (a new Kaggle session) starts with the earlier links' rows."""
        run_dir = ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else ckpt_path.parent
        mine, theirs = self.out / "metrics.jsonl", run_dir / "metrics.jsonl"
        source = mine if mine.exists() else theirs
        if not source.exists():
            return
        rows = metrics_lines(source, upto=step)
        self.out.mkdir(parents=True, exist_ok=True)
        write_metrics_lines(mine, rows)

    def _build(self) -> None:
        cfg, rt = self.cfg, self.rt
        seed_everything(cfg.seed + rt.rank)
        self.model = GPT(self.data.vocab, cfg.context, cfg.width, cfg.heads, cfg.layers).to(rt.device)
        self.optimizer = make_optimizer(self.model, cfg, rt.device)
        self.scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.precision == "fp16")
        self.step, self.tokens, self.elapsed_before, self.session = 0, 0, 0.0, 1
        self.save_failure: str | None = None
        if self.ckpt is not None:
            self.model.load_state_dict(self.ckpt["model"])
            self.optimizer.load_state_dict(self.ckpt["optimizer"])
            self.scaler.load_state_dict(self.ckpt["scaler"])
            self.step, self.tokens = self.ckpt["step"], self.ckpt["tokens"]
            self.elapsed_before = self.ckpt.get("elapsed_s", 0.0)
            self.session = self.ckpt.get("session", 0) + 1
            rngs = self.ckpt["rng"]
            if len(rngs) == rt.world:
                set_rng_state(rngs[rt.rank])
        if rt.world > 1:
            self.wrapped = wrap_ddp(self.model, rt.device)
        elif rt.data_parallel:
            self.wrapped = nn.DataParallel(self.model)
        else:
            self.wrapped = self.model
        # Under DataParallel one process feeds all cards: its rows are the whole step's.
        self.rows = cfg.batch_per_card * (rt.cards if rt.data_parallel else 1)
        self.tokens_per_step = cfg.batch_per_card * rt.cards * cfg.grad_accum * cfg.context
        self.val = self.data.val_batches(rank=rt.rank, world=rt.world, rows=self.rows,
                                         batches=cfg.eval_batches, context=cfg.context)
        self.batches = Prefetcher(self._read_batch, rt.device)
        self.forward, self.compile_s = self.wrapped, None  # forward: the wrapped model, compiled by run()
        self.eval_failed = False

    def _read_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, rt = self.cfg, self.rt
        return self.data.train_batch(seed=cfg.seed, step=step, micro=micro, accum=cfg.grad_accum,
                                     rank=rt.rank, world=rt.world, rows=self.rows, context=cfg.context)

    def compile(self) -> None:
        """Compiles the training forward when the config and the machine call for it (see
        `compile_choice`), with one trial pass so compiling happens now, not in step one."""
        cfg = self.cfg
        work = flops_per_token(cfg.layers, cfg.width, self.data.vocab, cfg.context) * self.tokens_per_step \
            * (cfg.steps_until - self.step)
        wanted, why = compile_choice(self.cfg.torch_compile, self.rt.device, work)
        if not wanted:
            self.log(f"not compiling: {why}")
            return
        self.log(f"compiling the model: {why}")
        self.forward, self.compile_s = compile_or_eager(
            self.wrapped, self._trial_pass, self.log,
            agree_ok=lambda ok: agree([0.0 if ok else 1.0], self.rt)[0] == 0.0)

    def _trial_pass(self, forward: nn.Module) -> None:
        x = torch.zeros(self.rows, self.cfg.context, dtype=torch.long, device=self.rt.device)
        try:
            with trial_context(self.wrapped), autocast(self.rt):
                loss = forward(x, x).mean()
            loss.backward()
        finally:
            self.optimizer.zero_grad(set_to_none=True)

    # --- one step ----------------------------------------------------------------------
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over `grad_accum` micro-batches; returns (loss, grad norm) on device."""
        cfg, rt = self.cfg, self.rt
        lr = lr_for_config(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=rt.device)
        for micro in range(cfg.grad_accum):
            x, y = self.batches.take(self.step, micro)
            # Gradients are all-reduced only on the last micro-batch.
            sync = rt.world == 1 or micro == cfg.grad_accum - 1
            with (nullcontext() if sync else self.wrapped.no_sync()):
                with autocast(rt):
                    loss = self.forward(x, y).mean() / cfg.grad_accum
                self.scaler.scale(loss).backward()
            total += loss.detach()
            # The next batch is read while the card still works through this backward pass.
            last = micro == cfg.grad_accum - 1
            self.batches.prepare(self.step + 1 if last else self.step, 0 if last else micro + 1)
        self.scaler.unscale_(self.optimizer)
        if cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        else:
            norm = torch.zeros((), device=rt.device)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += self.tokens_per_step
        return total, norm

    def step_or_explain(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return self.train_step()
        except torch.cuda.OutOfMemoryError:
            pass  # leave the except block first, so the failed step's tensors can be freed
        raise OutOfMemory(self._out_of_memory_message()) from None

    def _out_of_memory_message(self) -> str:
        cfg, rt = self.cfg, self.rt
        self.optimizer.zero_grad(set_to_none=True)
        if rt.device.type == "cuda":
            torch.cuda.empty_cache()
            card = f"{torch.cuda.get_device_name(rt.device)}, " \
                   f"{torch.cuda.get_device_properties(rt.device).total_memory / 2**30:.1f} GiB"
        else:
            card = rt.device.type
        fits = largest_fitting(self._trial_fits, cfg.batch_per_card - 1)
        keep = -(-cfg.batch_per_card * cfg.grad_accum // fits) if fits else None
        advice = (f"batch_per_card {fits} fits (measured by a trial step)" + (
            f"; to keep the tokens per step, use grad_accum {keep}" if keep and keep != cfg.grad_accum else "")
            if fits else "not even batch 1 fits: lower context or the model size")
        return (f"CUDA out of memory at batch_per_card {cfg.batch_per_card} ({card}): lower the batch per card — "
                f"{advice}")

    def _trial_fits(self, rows: int) -> bool:
        """One forward and backward at `rows` rows, without touching the weights."""
        x = torch.zeros(rows * (self.rt.cards if self.rt.data_parallel else 1), self.cfg.context,
                        dtype=torch.long, device=self.rt.device)
        try:
            with autocast(self.rt):
                loss = self.wrapped(x, x).mean() if self.rt.data_parallel else self.model(x, x)
            loss.backward()
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            if self.rt.device.type == "cuda":
                torch.cuda.empty_cache()

    @torch.no_grad()
    def evaluate(self) -> float:
        # Each DDP rank scores its own windows (uncompiled: with the bare model); DataParallel spreads them.
        eager = self.model if self.rt.world > 1 else self.wrapped
        # When training is compiled, so is the evaluation: it must stay within 3% of a session.
        model = self.forward if self.compile_s is not None and not self.eval_failed else eager
        self.model.eval()
        try:
            total = self._val_loss_sum(model)
        except Exception as e:  # noqa: BLE001 -- only a compiled evaluation is retried, see below
            if model is eager:
                raise
            self.eval_failed = True
            self.log(f"torch.compile failed on the evaluation ({type(e).__name__}); evaluating uncompiled")
            total = self._val_loss_sum(eager)
        finally:
            self.model.train()
        summed, count = agree([total.item(), len(self.val)], self.rt)
        return summed / count

    def _val_loss_sum(self, model: nn.Module) -> torch.Tensor:
        total = torch.zeros((), device=self.rt.device)
        for x, y in self.val:
            with autocast(self.rt):
                total += model(x.to(self.rt.device), y.to(self.rt.device)).mean().float()
        return total

    @torch.no_grad()
    def sample(self, tokens: int = 48) -> str:
        import sentencepiece as spm  # kernel side: on every Kaggle image
        sp = spm.SentencePieceProcessor(model_file=str(self.data.tokenizer_path))
        # Every document in the shards follows an EOS, so EOS is where a new text begins.
        start = torch.tensor([[self.data.manifest["tokenizer"].get("eos_id", sp.eos_id())]], device=self.rt.device)
        gen = torch.Generator(device=self.rt.device).manual_seed(self.cfg.seed)
        self.model.eval()
        with autocast(self.rt):
            out = self.model.generate(start, tokens, generator=gen)
        self.model.train()
        return sp.decode(out[0, 1:].tolist())

    # --- checkpoints -------------------------------------------------------------------
    def save(self, elapsed: float) -> Path | None:
        """Saves on rank 0 (every rank calls it: the RNG states are gathered). A failed save (a
        full disk) is said and training goes on: the previous checkpoint is kept, and the next
        save tries again. Returns the checkpoint written, or None."""
        rngs = all_ranks(rng_state(), self.rt)  # a collective: every rank calls save
        if not self.rt.main:
            return None
        state = {"format": FORMAT, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scaler": self.scaler.state_dict(), "step": self.step, "tokens": self.tokens, "rng": rngs,
                 "data": {"sampler": "uniform-offsets-by-step", "seed": self.cfg.seed, "step": self.step},
                 "config": self.cfg.to_dict(), "tokenizer_sha256": self.data.manifest["tokenizer"]["sha256"],
                 "val_set": self.data.val_set, "weights": self.model.num_weights(),
                 "elapsed_s": self.elapsed_before + elapsed, "session": self.session}
        try:
            return save_checkpoint(state, self.out / "checkpoints")
        except CheckpointSaveError as e:
            self.log(f"warning: {e}")
            self.save_failure = str(e)
            return None

    # --- the loop ----------------------------------------------------------------------
    def run(self) -> dict:
        cfg, rt = self.cfg, self.rt
        self.out.mkdir(parents=True, exist_ok=True)
        if rt.main and self.ckpt is not None:
            self._continue_metrics(self.resume_path, self.ckpt["step"])
        if rt.main:
            (self.out / "config.json").write_text(cfg.to_json(), encoding="utf-8")
            (self.out / "device.json").write_text(json.dumps(describe_runtime(rt, self.data.vocab)), encoding="utf-8")
        self.log(f"weights {self.model.num_weights():,}")
        self.log(f"device {rt.device.type} x{rt.cards} {rt.precision}, {self.tokens_per_step:,} tokens per step, "
                 f"data {'+'.join(self.data.constellations)} ({self.data.manifest['train_tokens']:,} train tokens)")
        metrics = open(self.out / "metrics.jsonl", "a", encoding="utf-8") if rt.main else None
        guard = StopGuard(cfg.limit_min, started=self.started, stop_file=self.stop_file)
        self.compile()  # before the loop: the compile time stays out of the step time below
        # A save's cost until one is measured: weights, AdamW's two moments and fp32 copies at ~200 MB/s.
        step_s, save_s, reason, path = 0.0, 0.5 + self.model.num_weights() * 16 / 200e6, None, None
        readings, last_save, last_print, printed = Readings(), time.monotonic(), 0.0, False
        window_t0, window_tokens, window_steps = time.monotonic(), self.tokens, 0
        last_eval, sync_steps, next_sync = self.step, 1, self.step + 1
        try:
            with guard:
                while True:
                    if self.step >= cfg.steps_until:
                        reason = "steps_until reached"
                    if reason is None:
                        loss, norm = self.step_or_explain()
                        window_steps += 1
                        if self.step % cfg.log_every == 0:
                            readings.add({"step": self.step, "tokens": self.tokens, "loss": None,
                                          "lr": lr_for_config(self.step - 1, cfg), "grad_norm": None, "tok_s": None,
                                          "elapsed_s": round(self.elapsed_before + guard.elapsed(), 3),
                                          "session": self.session}, loss, norm)
                    eval_due = self.step != last_eval and (self.step % cfg.eval_every == 0
                                                           or reason == "steps_until reached")
                    if not (reason or eval_due or self.step >= next_sync):
                        continue  # no host sync between sync points: the card never waits for us
                    # A sync point: one collective reads the window's losses and agrees on
                    # stopping, saving and the next sync point (steps are the same on every rank).
                    own = reason or guard.reason(step_s * sync_steps, save_s)
                    due = 1.0 if time.monotonic() - last_save > cfg.checkpoint_every_min * 60 else 0.0
                    within_s = min(cfg.checkpoint_every_min * 60, guard.left_s() / 4)
                    agree = [float(bool(own)), float(own == "time limit"), due, float(next_sync_steps(step_s, within_s))]
                    rows, (stop, limit_hit, save_due, steps_sum) = readings.take(rt.device, agree,
                                                                                 lambda t: sum_ranks(t, rt))
                    now = time.monotonic()
                    rate = (self.tokens - window_tokens) / max(now - window_t0, 1e-9)
                    if window_steps:
                        step_s = (now - window_t0) / window_steps
                    sync_steps = max(1, int(steps_sum / rt.world))
                    next_sync = self.step + sync_steps
                    for row in rows:
                        row["loss"], row["tok_s"] = row["loss"] / rt.world, rate
                    if stop and not reason:  # every rank stops here, for the same reason where it is the clock
                        reason = own or ("time limit" if limit_hit else "another rank stopped")
                    if eval_due:
                        last_eval = self.step
                        if not (rows and rows[-1]["step"] == self.step):
                            rows.append({"step": self.step, "tokens": self.tokens, "session": self.session})
                        rows[-1].update(val_loss=self.evaluate(), val_set=self.data.val_set)
                        if rt.main:
                            rows[-1]["sample"] = self.sample()
                            self.log(f"step {self.step:,}: val {rows[-1]['val_loss']:.4f} | {rows[-1]['sample']!r}")
                    if rows and rt.main:
                        metrics.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
                        metrics.flush()
                        for record in rows:
                            if self.on_metrics:
                                self.on_metrics(record)
                            echo_metrics(record)  # into the log: the live curve of a session running elsewhere
                    if reason or save_due:
                        t_save = time.monotonic()
                        path = self.save(guard.elapsed()) or path
                        save_s, last_save = time.monotonic() - t_save, time.monotonic()
                    if reason:
                        break
                    logged = [r for r in rows if "loss" in r]
                    if logged and (not printed or time.monotonic() - last_print >= PROGRESS_EVERY_S):
                        self.log(_progress_line(logged[-1], cfg.steps_until))
                        last_print, printed = time.monotonic(), True
                    # tok_s and the step time measure training, not evaluations and saves.
                    window_t0, window_tokens, window_steps = time.monotonic(), self.tokens, 0
        finally:
            if metrics:
                metrics.close()
        if path is None or checkpoint_step(path) != self.step:
            return self._unsaved_result(reason)
        self.log(f"stopped at step {self.step:,} ({reason}); checkpoint {path}")
        return {"step": self.step, "tokens": self.tokens, "reason": reason, "checkpoint": str(path),
                "steps_until": cfg.steps_until, "done": self.step >= cfg.steps_until,
                "compile_s": self.compile_s}

    def _unsaved_result(self, reason: str) -> dict:
        """The last save failed: the run continues from the newest whole checkpoint, so that is
        where this session is said to end (the steps after it are not saved anywhere)."""
        newest = newest_whole_checkpoint(self.out / "checkpoints") if self.rt.main else None
        step, tokens = (newest[1]["step"], newest[1]["tokens"]) if newest else (0, 0)
        self.log(f"stopped at step {self.step:,} ({reason}) but its checkpoint could not be saved: "
                 f"{self.save_failure}")
        return {"step": step, "tokens": tokens, "reason": f"{reason}; the final save failed",
                "checkpoint": str(newest[0]) if newest else None, "trained_to": self.step,
                "save_failed": self.save_failure, "steps_until": self.cfg.steps_until, "done": False}


PROGRESS_EVERY_S = 10  # a progress line at most this often: a 12-hour session stays readable


def _progress_line(record: dict, steps_until: int) -> str:
    return (f"step {record['step']:,}/{steps_until:,} loss {record['loss']:.4f} lr {record['lr']:.2e} "
            f"{record['tok_s']:,.0f} tok/s {record['elapsed_s']:.0f}s")


def describe_runtime(rt: Runtime, vocab: int) -> dict:
    name = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu"
    return {"gpu": card_set(name, rt.cards), "device": rt.device.type, "name": name, "cards": rt.cards,
            "precision": rt.precision, "world": rt.world, "vocab": vocab, "torch": torch.__version__}


def train(cfg: RunConfig, out_dir, data_dir, **kwargs) -> dict:
    """Trains until `steps_until`, the time limit or a signal; returns what happened."""
    trainer = Trainer(cfg, out_dir, data_dir, **kwargs)
    try:
        return trainer.run()
    finally:
        if trainer.rt.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
