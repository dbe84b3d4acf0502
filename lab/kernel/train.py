"""The training loop: one session of a run, from its start (or its checkpoint) to its stop.

`Trainer.__init__` opens the data and builds the model and its optimizer, or restores them from
the checkpoint. `Trainer.run` is the loop: take a step (`step.one_step`); at each sync point,
about once a second, read the losses of the steps since the last one, agree with the other
ranks on stopping and saving, evaluate now and then, write the metrics and save; stop at
`steps_until`, at the time limit or at a signal, always after a save. The same loop runs in one
process, in each of torchrun's processes (DDP) or over one process's cards (DataParallel).
Names from the appendix (where this process trains, speed-ups, files) are said where they are used.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from lab.config import RunConfig, check, check_against_data, check_resume, raise_on_errors
from lab.kernel.checkpoint import (FORMAT, CheckpointError, CheckpointSaveError, checkpoint_step, load_checkpoint,
                                   newest_whole_checkpoint, resolve_checkpoint, save_checkpoint)
from lab.kernel.data import Prefetcher, TokenData
from lab.kernel.fitting import OutOfMemory, out_of_memory_advice
from lab.kernel.metrics import METRICS, continue_metrics
from lab.kernel.model import GPT
from lab.kernel.ranks import agree, all_ranks
from lab.kernel.runtime import (compile_model, describe_runtime, precision_warning, rng_state, seed_everything,
                                set_rng_state, setup_runtime)
from lab.kernel.saver import Saver, StopGuard, stable_marks
from lab.kernel.schedule import lr_for_config
from lab.kernel.step import StepParts, autocast, make_optimizer, one_step, wrap_for
from lab.kernel.sync import MetricsSink, Progress, SyncWindow


class Trainer:
    """One session of a run. `cfg` is the run as it continues: for a resumed run, settled before
    (the checkpoint's fields with what was given now on top, by the control side); here it is only
    checked. `limit_min` is this session's own time limit (None: the run's `limit_min`); it counts
    from `started` (a `time.monotonic()`; None: now)."""

    def __init__(self, cfg: RunConfig, out_dir: str | os.PathLike, data_dir: str | os.PathLike,
                 resume: str | os.PathLike | None = None, allow_fallback: bool = False,
                 log: Callable[[str], None] = print, on_metrics: Callable[[dict], None] | None = None,
                 started: float | None = None, stop_file: str | os.PathLike | None = None,
                 limit_min: float | None = None):
        self.cfg, self.out, self.log_fn, self.on_metrics, self.stop_file = cfg, Path(out_dir), log, on_metrics, stop_file
        self.limit_min = cfg.limit_min if limit_min is None else limit_min
        self.started = time.monotonic() if started is None else started
        self.data = TokenData(data_dir)
        self.ckpt = self._load_resume(resume, allow_fallback)
        self.rt = setup_runtime(cfg)  # one process, one of torchrun's, or DataParallel (runtime)
        if self.ckpt is not None:
            self.log(f"resuming from {self.resume_path} at step {self.ckpt['step']:,}")
        raise_on_errors(check(cfg) + check_against_data(cfg, self.data.shortest_split))
        if self.ckpt is None and (self.out / METRICS).exists():
            raise CheckpointError(f"{self.out} already holds a run (metrics.jsonl): continue it with "
                                  f"--resume {self.out}, or choose another --out")
        if warning := precision_warning(self.rt.device, self.rt.precision):
            self.log(warning)
        self._build()

    def log(self, text: str) -> None:
        if self.rt.main:
            self.log_fn(text)

    def _load_resume(self, resume, allow_fallback) -> dict | None:
        """The checkpoint to continue from, checked against the run: the same model, steps_until
        above its step, data tokenized with its tokenizer."""
        if not resume:
            return None
        path = resolve_checkpoint(resume, allow_fallback)
        state = load_checkpoint(path)
        raise_on_errors(check_resume(self.cfg, state["config"], state["step"]))
        if state["tokenizer_sha256"] != self.data.manifest["tokenizer"]["sha256"]:
            raise CheckpointError(
                "the data was tokenized with another tokenizer than the checkpoint's: prepare the data with "
                "constellations that include the checkpoint's, so `lab prepare` reuses its tokenizer")
        self.resume_path = path
        return state

    def _build(self) -> None:
        cfg, rt = self.cfg, self.rt
        seed_everything(cfg.seed + rt.rank)
        self.model = GPT(self.data.vocab, cfg.context, cfg.width, cfg.heads, cfg.layers).to(rt.device)
        optimizer = make_optimizer(self.model, cfg, rt.device)
        scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.precision == "fp16")
        self.step, self.tokens, self.elapsed_before, self.session = 0, 0, 0.0, 1
        self.save_failure: str | None = None
        if self.ckpt is not None:
            self.model.load_state_dict(self.ckpt["model"])
            optimizer.load_state_dict(self.ckpt["optimizer"])
            scaler.load_state_dict(self.ckpt["scaler"])
            self.step, self.tokens = self.ckpt["step"], self.ckpt["tokens"]
            self.elapsed_before = self.ckpt.get("elapsed_s", 0.0)
            self.session = self.ckpt.get("session", 0) + 1
            rngs = self.ckpt["rng"]
            if len(rngs) == rt.world:
                set_rng_state(rngs[rt.rank])
        self.parts = StepParts(self.model, wrap_for(self.model, rt), optimizer, scaler, rt)
        # Under DataParallel one process feeds all cards: its rows are the whole step's.
        self.rows = cfg.batch_per_card * (rt.cards if rt.data_parallel else 1)
        self.tokens_per_step = cfg.batch_per_card * rt.cards * cfg.grad_accum * cfg.context
        self.val = self.data.val_batches(rank=rt.rank, world=rt.world, rows=self.rows,
                                         batches=cfg.eval_batches, context=cfg.context)
        self.batches = Prefetcher(self._read_batch, rt.device)
        # Evaluation: a DDP rank scores its own windows on its bare model; DataParallel spreads them
        # over its cards. A compiled run evaluates compiled too (runtime.compile_model).
        self.eval_model = self.model if rt.world > 1 else self.parts.wrapped
        self.compile_s: float | None = None  # the seconds compiling took; None: uncompiled
        self.first_step_s: float | None = None  # from the session's start to its first steps synced

    def _read_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, rt = self.cfg, self.rt
        return self.data.train_batch(seed=cfg.seed, step=step, micro=micro, accum=cfg.grad_accum,
                                     rank=rt.rank, world=rt.world, rows=self.rows, context=cfg.context)

    # --- one step, an evaluation, a save --------------------------------------------------
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over `grad_accum` micro-batches; returns (loss, grad norm) on device."""
        cfg = self.cfg
        out = one_step(self.parts, self.batches, self.step, lr_for_config(self.step, cfg), cfg.grad_accum,
                       cfg.grad_clip)
        self.step += 1
        self.tokens += self.tokens_per_step
        return out

    def step_or_explain(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return self.train_step()
        except torch.cuda.OutOfMemoryError:
            pass  # leave the except block first, so the failed step's tensors can be freed
        raise OutOfMemory(out_of_memory_advice(self.parts, self.cfg)) from None  # which batch fits (fitting)

    @torch.no_grad()
    def evaluate(self) -> float:
        """The mean loss over the run's val windows: the same text at every evaluation of the run."""
        total = torch.zeros((), device=self.rt.device)
        self.model.eval()
        try:
            for x, y in self.val:
                with autocast(self.rt):
                    total += self.eval_model(x.to(self.rt.device), y.to(self.rt.device)).mean().float()
        finally:
            self.model.train()
        summed, count = agree([total.item(), len(self.val)], self.rt)  # every rank's windows (ranks)
        return summed / count

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

    def _evaluate_into(self, rows: list[dict]) -> None:
        """The evaluation at this step, into its row (a new one when the step was not logged);
        on rank 0 with a text sample."""
        if not (rows and rows[-1]["step"] == self.step):
            rows.append({"step": self.step, "tokens": self.tokens, "session": self.session})
        rows[-1].update(val_loss=self.evaluate(), val_set=self.data.val_set)
        if self.rt.main:
            rows[-1]["sample"] = self.sample()
            self.log(f"step {self.step:,}: val {rows[-1]['val_loss']:.4f} | {rows[-1]['sample']!r}")

    def save(self, elapsed: float) -> Path | None:
        """Saves on rank 0 (every rank calls it: the RNG states are gathered). A failed save (a
        full disk) is said and training goes on: the previous checkpoint is kept, and the next
        save tries again. Returns the checkpoint written, or None."""
        rngs = all_ranks(rng_state(), self.rt)  # a collective: every rank calls save
        if not self.rt.main:
            return None
        parts = self.parts
        state = {"format": FORMAT, "model": self.model.state_dict(), "optimizer": parts.optimizer.state_dict(),
                 "scaler": parts.scaler.state_dict(), "step": self.step, "tokens": self.tokens, "rng": rngs,
                 "data": {"sampler": "uniform-offsets-by-step", "seed": self.cfg.seed, "step": self.step},
                 "config": self.cfg.to_dict(), "tokenizer_sha256": self.data.manifest["tokenizer"]["sha256"],
                 "val_set": self.data.val_set, "weights": self.model.num_weights(),
                 "elapsed_s": self.elapsed_before + elapsed, "session": self.session}
        try:
            return save_checkpoint(state, self.out / "checkpoints")  # one commit point (checkpoint)
        except CheckpointSaveError as e:
            self.log(f"warning: {e}")
            self.save_failure = str(e)
            return None

    # --- the loop ----------------------------------------------------------------------
    def run(self) -> dict:
        """Trains until steps_until, the time limit or a stop; returns where it stopped and why."""
        cfg = self.cfg
        self._start_outputs()
        guard = StopGuard(self.limit_min, started=self.started, stop_file=self.stop_file)
        compile_model(self)  # where it pays, before the loop: the step time stays the steps' (runtime)
        window = SyncWindow(self.rt, self.step, self.tokens, scaled=self.parts.scaler.is_enabled())
        saver = Saver(lambda: self.save(guard.elapsed()), self.model.num_weights(), cfg.checkpoint_every_min)
        progress, reason, last_eval = Progress(cfg.steps_until, self.log), None, self.step
        marks, first = set(stable_marks(cfg)), self.step  # branches start, and a run grows, from these
        with guard, MetricsSink(self.out / METRICS if self.rt.main else None, self.on_metrics) as sink:
            while True:
                if reason is None and self.step >= cfg.steps_until:
                    reason = "steps_until reached"
                if reason is None:
                    loss, norm = self.step_or_explain()
                    window.stepped(loss, norm, self._row(guard) if self.step % cfg.log_every == 0 else None)
                eval_due = self.step != last_eval and (self.step % cfg.eval_every == 0
                                                       or reason == "steps_until reached")
                at_mark = self.step in marks and self.step != first and self.step < cfg.steps_until
                if not (reason or eval_due or at_mark or window.due(self.step)):
                    continue  # no host sync between sync points: the card never waits for us
                rows, reason, save_due = self._sync_point(window, guard, saver, reason)
                if self.first_step_s is None:  # the session's time to its first steps, for the control side
                    self.first_step_s = round(guard.elapsed(), 3)
                if eval_due:
                    last_eval = self.step
                    self._evaluate_into(rows)
                sink.write(rows)
                if reason or save_due or at_mark:
                    saver.save()
                if reason:
                    break
                progress.show(rows)
                window.restart(self.tokens)
        return {**self._result(reason, saver.path, window.skipped), "save_s": round(saver.cost_s, 3)}

    def _start_outputs(self) -> None:
        """The run folder as this session starts: the metrics cut at the checkpoint's step, the
        config and the device it runs on; the opening lines of the log."""
        cfg, rt = self.cfg, self.rt
        self.out.mkdir(parents=True, exist_ok=True)
        if rt.main and self.ckpt is not None:
            continue_metrics(self.out, self.resume_path, self.ckpt["step"])
        if rt.main:
            (self.out / "config.json").write_text(cfg.to_json(), encoding="utf-8")
            (self.out / "device.json").write_text(json.dumps(describe_runtime(rt, self.data.vocab)), encoding="utf-8")
        self.log(f"weights {self.model.num_weights():,}")
        self.log(f"device {rt.device.type} x{rt.cards} {rt.precision}, {self.tokens_per_step:,} tokens per step, "
                 f"data {'+'.join(self.data.constellations)} ({self.data.manifest['train_tokens']:,} train tokens)")

    def _row(self, guard: StopGuard) -> dict:
        """The metrics row of the step just taken; its loss, grad_norm and tok_s come at the sync point."""
        return {"step": self.step, "tokens": self.tokens, "loss": None, "lr": lr_for_config(self.step - 1, self.cfg),
                "grad_norm": None, "tok_s": None, "elapsed_s": round(self.elapsed_before + guard.elapsed(), 3),
                "session": self.session}

    def _sync_point(self, window: SyncWindow, guard: StopGuard, saver: Saver,
                    reason: str | None) -> tuple[list[dict], str | None, bool]:
        """(the window's rows, why the loop stops or None, whether to save), agreed by every rank
        in one collective: a rank stops when any does, for the same reason where it is the clock."""
        own = reason or guard.reason(window.ahead_s(), saver.cost_s)
        within_s = min(saver.every_s, guard.left_s() / 4)
        rows, (stop, limit_hit, save_due) = window.sync(
            self.step, self.tokens, [float(bool(own)), float(own == "time limit"), float(saver.due())], within_s)
        if stop and not reason:
            reason = own or ("time limit" if limit_hit else "another rank stopped")
        return rows, reason, bool(save_due)

    def _result(self, reason: str, path: Path | None, skipped: int) -> dict:
        if skipped:
            self.log(f"the GradScaler skipped {skipped:,} steps of this session (fp16 gradients overflowed; "
                     f"it lowered its scale each time and training went on); their rows say \"skipped\"")
        if path is None or checkpoint_step(path) != self.step:
            return self._unsaved_result(reason)
        self.log(f"stopped at step {self.step:,} ({reason}); checkpoint {path}")
        return {"step": self.step, "tokens": self.tokens, "reason": reason, "checkpoint": str(path),
                "steps_until": self.cfg.steps_until, "done": self.step >= self.cfg.steps_until,
                "compile_s": self.compile_s, "first_step_s": self.first_step_s, "skipped_steps": skipped}

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


def train(cfg: RunConfig, out_dir, data_dir, **kwargs) -> dict:
    """Trains until `steps_until`, the time limit or a signal; returns what happened."""
    trainer = Trainer(cfg, out_dir, data_dir, **kwargs)
    try:
        return trainer.run()
    finally:
        if trainer.rt.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
