"""The emulated Kaggle: running sessions (start, charge quota, enforce limits, stop)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

from lab.procs import descendants, signal_quietly
from kaggle_emulator.files import _kill_tree
from kaggle_emulator.model import TERMINAL, _Session, _utcnow


EMULATED_IMAGE = "kaggle-emulator"  # the image version a session reads (GIT_COMMIT)
# Put on a broken account's sessions' Python path: in a torchrun worker without NCCL_P2P_DISABLE=1
# every all-reduce fails, as a broken peer-to-peer path between two cards might.
BROKEN_P2P = """import os
if "RANK" in os.environ and os.environ.get("NCCL_P2P_DISABLE") != "1":
    import torch.distributed as _dist

    def _broken_all_reduce(*args, **kwargs):
        raise RuntimeError("NCCL error: unhandled system error (emulated: the P2P path between the cards is broken)")
    _dist.all_reduce = _broken_all_reduce
"""


# The pushed notebooks' parameters that are lengths of time: the training notebook's (minutes) and
# the probe's hold (seconds, lab.probe.account.probe_notebook). The probe's worker timeout stays: it cuts
# off a hang, and workers start as slowly here as they do.
TIME_PARAMETERS = ("limit_min", "checkpoint_every_min", "hold_s")


# The first line a session's notebook prints: its clock (quota, timeout) starts there. Starting
# papermill and its kernel costs this machine seconds that Kaggle's own start-up does not (the kit
# allows for Kaggle's in STARTUP_MIN), and at a fast time scale those seconds would eat a short
# session (a probe: 20 emulated minutes are 20 s at --time-scale 60).
CLOCK_MARK = "[kaggle-emulator] the notebook runs"
BOOT_LIMIT_S = 120.0  # a notebook that prints nothing this long after its launch: its clock starts all the same


def _emulator_cell(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {"tags": ["kaggle-emulator"]}, "outputs": [],
            "source": "# Added by the Kaggle emulator.\n" + source}


class Sessions:
    """Part of KaggleEmulator (a mixin): its state lives there."""

    def _as_run_here(self, text: str) -> str:
        """The pushed notebook as the emulator runs it, with one cell added after its parameters:
        the notebook's time parameters on the emulator's clock (`time_scale` emulated seconds per
        wall second: quota and session timeouts run that fast too) — the training notebook's
        limits and the probe's hold, else a probe holding its session for 150
        real seconds outlives its 20-minute session at any fast scale — and with `min_step_s` a card
        no faster than one training step per that many wall seconds, so how far a session gets
        within its limit does not depend on how fast this machine is."""
        lines = []
        if self.time_scale != 1.0:  # a training notebook's spec (`run`, `session`), or a probe's own values
            lines += [f"for _where in [globals()] + [globals()[_n] for _n in ('run', 'session') if isinstance("
                      "globals().get(_n), dict)]:",
                      f"    for _name in {TIME_PARAMETERS!r}:",
                      "        if isinstance(_where.get(_name), (int, float)) and _where[_name]:",
                      f"            _where[_name] = _where[_name] / {self.time_scale!r}"]
        if self.min_step_s:
            lines += ["import time as _emu_time", "import torch as _emu_torch",
                      "_emu_backward = _emu_torch.Tensor.backward",
                      "def _emu_paced_backward(self, *args, **kwargs):",
                      "    started = _emu_time.monotonic()",
                      "    out = _emu_backward(self, *args, **kwargs)",
                      f"    _emu_time.sleep(max(0.0, {self.min_step_s!r} - (_emu_time.monotonic() - started)))",
                      "    return out",
                      "_emu_torch.Tensor.backward = _emu_paced_backward"]
        try:
            nb = json.loads(text)
            cells = nb["cells"]
        except (ValueError, KeyError, TypeError):
            return text
        if lines:
            tags = [c.get("metadata", {}).get("tags", []) for c in cells]
            at = next((i for i, t in enumerate(tags) if "injected-parameters" in t),
                      next((i for i, t in enumerate(tags) if "parameters" in t), -1))
            cells.insert(at + 1, _emulator_cell("\n".join(lines)))
        cells.insert(0, _emulator_cell(f"print({CLOCK_MARK!r}, flush=True)"))  # the session's clock starts here
        return json.dumps(nb)

    def _supervise(self) -> None:
        """One thread runs every session: starts due ones, charges quota, enforces limits."""
        last = time.monotonic()
        while not self._stopping.wait(self.tick_s):
            now = time.monotonic()
            dt, last = now - last, now
            for s in self._due_sessions(now):
                self._launch(s)
            with self._lock:
                self._refresh_quotas()
                self._charge_and_limit(dt, now)
                self._reap(now)

    def _due_sessions(self, now: float) -> list[_Session]:
        with self._lock:
            due = [s for s in self._sessions.values()
                   if s.status == "QUEUED" and not s.held and now - s.queued_at >= self.queue_s]
            for s in due:
                account = self._accounts[s.owner]
                if s.gpu and self._gpu_left(account) <= 0:
                    self._finish(s, "ERROR", "The account's GPU quota ran out before the session started.")
            due = [s for s in due if s.status == "QUEUED"]
            for s in due:
                s.launching = True
            return due

    def _launch(self, s: _Session) -> None:
        """Builds the sandbox and starts papermill (outside the lock: copying takes time)."""
        try:
            for sub in ("input", "working", "tmp"):
                (s.root / sub).mkdir(parents=True, exist_ok=True)
            for source, where in s.mounts:
                shutil.copytree(source, s.root / "input" / where, dirs_exist_ok=True)
            with self._lock:
                text = self._kernels[(s.owner, s.slug)].versions[s.version - 1].text
            notebook = s.folder / "notebook.ipynb"
            notebook.write_text(self._as_run_here(text), encoding="utf-8")
            cmd = [sys.executable, "-m", "papermill", str(notebook), str(s.folder / "executed.ipynb"),
                   "--cwd", str(s.working), "-k", self.kernel_name, "--log-output", "--no-progress-bar"]
            proc = subprocess.Popen(cmd, cwd=s.working, env=self._session_env(s), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=hasattr(os, "setsid"))
        except (OSError, KeyError) as e:
            with self._lock:
                s.launching = False
                self._finish(s, "ERROR", f"The emulator could not start the session: {e}")
            return
        with self._lock:
            s.proc, s.launched_at, s.launching = proc, time.monotonic(), False
            if s.status == "QUEUED":
                s.status = "RUNNING"
                self._accounts[s.owner].has_ever_run |= s.gpu
            if s.stop_reason is not None:  # cancelled while the sandbox was being built
                self._stop_session(s, s.stop_reason)
        threading.Thread(target=self._read_log, args=(s, proc), name=f"kaggle-emulator-log-{s.id}",
                         daemon=True).start()

    def _session_env(self, s: _Session) -> dict[str, str]:
        """The notebook's environment: the fake /kaggle, no GPU, the image's version as Kaggle's
        image sets it (GIT_COMMIT, BUILD_DATE), and none of this machine's credentials or Python
        path (a bare Kaggle image has neither). An account whose NCCL peer-to-peer path is broken
        gets a `sitecustomize` that fails every torchrun worker's all-reduce unless
        NCCL_P2P_DISABLE=1 *(assumed: how a broken P2P path shows is not on record)*."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("KAGGLE_", "LAB_")) and k not in ("PYTHONPATH", "GIT_COMMIT", "BUILD_DATE")}
        env.update(LAB_KAGGLE_ROOT=str(s.root), KAGGLE_KERNEL_RUN_TYPE="Batch", CUDA_VISIBLE_DEVICES="",
                   PYTHONUNBUFFERED="1", TMPDIR=str(s.root / "tmp"), GIT_COMMIT=s.image.rpartition(":")[2] or EMULATED_IMAGE,
                   BUILD_DATE=_utcnow().strftime("%Y%m%d-000000"))
        if self._accounts[s.owner].nccl_p2p_broken:
            site = s.folder / "site"
            site.mkdir(parents=True, exist_ok=True)
            (site / "sitecustomize.py").write_text(BROKEN_P2P, encoding="utf-8")
            env["PYTHONPATH"] = str(site)
        return env

    def _read_log(self, s: _Session, proc: subprocess.Popen) -> None:
        """Collects papermill's output as Kaggle-style log entries *(assumed format:
        [{"stream_name", "time", "data"}])*; ends when the process closes its output."""
        started = time.monotonic()
        try:
            with open(s.folder / "log.txt", "wb") as raw:
                for line in iter(proc.stdout.readline, b""):
                    raw.write(line)
                    raw.flush()
                    with self._lock:
                        if s.started_at is None and CLOCK_MARK.encode() in line:
                            s.started_at = time.monotonic()
                        s.log.append({"stream_name": "stdout", "time": round(time.monotonic() - started, 3),
                                      "data": line.decode("utf-8", "replace")})
        except (OSError, ValueError):
            pass
        finally:
            s.log_done.set()

    def _refresh_quotas(self) -> None:
        now = _utcnow()
        for a in self._accounts.values():
            if now >= a.refresh_time:
                a.gpu_used_s = 0.0
                while a.refresh_time <= now:
                    a.refresh_time += timedelta(days=7)

    def _charge_and_limit(self, dt: float, now: float) -> None:
        for s in self._sessions.values():
            if s.started_at is None and s.launched_at is not None and now - s.launched_at > BOOT_LIMIT_S:
                s.started_at = s.launched_at
            if s.status not in ("RUNNING", "CANCEL_REQUESTED") or s.started_at is None or s.exited_at:
                continue
            account = self._accounts[s.owner]
            if s.gpu:
                account.gpu_used_s += dt * self.time_scale
                s.charged_s += dt * self.time_scale
            self._wedge_due(s, now)
            due = self.enforce_timeout and (now - s.started_at) * self.time_scale >= s.timeout_s
            if s.kill_once:  # a test's kill at a point of the session's own (a file it wrote), not a time
                due = any(s.working.glob(s.kill_once))
            if s.stop_reason is None and due:
                if s.kill_lost:  # *(assumed)* killed without SIGTERM, /kaggle/working not kept
                    s.stop_reason, s.outputs_lost = "timeout", not s.keep_outputs
                    if s.proc is not None:
                        _kill_tree(s.proc, getattr(signal, "SIGKILL", signal.SIGTERM))
                else:
                    self._stop_session(s, "timeout")
            elif s.stop_reason is None and s.gpu and account.gpu_used_s >= account.gpu_total_s \
                    and not self.quota_overrun:  # with it, a session runs on past the quota (two records)
                self._stop_session(s, "quota")

    def _stop_session(self, s: _Session, reason: str) -> None:
        """SIGTERM to what runs the notebook (the kernel and its children), as Kaggle stops a
        session; the SIGKILL follows in `_reap` after the grace period."""
        if s.stop_reason is None or s.stop_reason == reason:
            s.stop_reason = reason
        if s.proc is None:
            if not s.launching:  # never started: it just ends; `_launch` handles the other case
                self._finish(s, *self._ending(s, None))
            return
        if s.term_sent_at is None:
            s.term_sent_at = time.monotonic()
            targets = descendants(s.proc.pid) or [s.proc.pid]
            for pid in targets:
                signal_quietly(pid, signal.SIGTERM)

    def _reap(self, now: float) -> None:
        for s in self._sessions.values():
            if s.proc is None or s.status in TERMINAL:
                continue
            rc = s.proc.poll()
            if s.wedged:
                continue  # Kaggle lost it: it reads RUNNING until its kernel is deleted
            if rc is None:
                if s.term_sent_at is not None and now - s.term_sent_at > self.grace_s:
                    _kill_tree(s.proc, getattr(signal, "SIGKILL", signal.SIGTERM))
                continue
            if s.exited_at is None:
                s.exited_at = now
            # Wait briefly for the last lines of the log before the session reads as ended.
            if s.log_done.is_set() or now - s.exited_at > 3.0:
                self._finish(s, *self._ending(s, rc))

    def _ending(self, s: _Session, rc: int | None) -> tuple[str, str]:
        if s.stop_reason == "cancel":
            return "CANCEL_ACKNOWLEDGED", ""
        if s.stop_reason == "timeout":  # *(reported)* Kaggle's runtime cut-off gives no reason
            return s.timeout_status, ""
        if s.stop_reason == "quota":
            return "ERROR", "The account's weekly GPU quota ran out and the session was stopped."
        if s.stop_reason == "shutdown":
            return "ERROR", "The emulator shut down."
        if rc == 0:
            return "COMPLETE", ""
        return "ERROR", f"The notebook failed (papermill exit code {rc}); see the log."

    def _finish(self, s: _Session, status: str, failure: str) -> None:
        s.status, s.failure = status, failure
        if s.proc is not None and s.proc.stdout is not None and s.log_done.is_set():
            s.proc.stdout.close()


# ---------------------------------------------------------------------------------------------
# Processes and files

