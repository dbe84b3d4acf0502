"""Jupyter kernels for the tests, forked from a process that has already imported torch.

Every notebook the tests execute (papermill's own, the emulator's Kaggle sessions, the local
machine's runs) starts a fresh ipykernel, and each one spent about 3.3 s of the 3.7 s to its first
optimizer step importing torch, `torch._dynamo` (torch's optimizers import it at their first step)
and ipykernel itself: on the two-core CI machine, a large share of the suite. Here one server per
test process imports them once (and freezes what they made: `serve`); the kernelspec that the tests
put first on JUPYTER_PATH starts `launch`, which asks the server for a fork and stands in for it, so
that Jupyter, papermill and the kit see one process as they would see the kernel:

- the fork starts its own session (as jupyter_client starts a kernel) and takes the launcher's
  environment, working folder, arguments and standard streams;
- a signal to the launcher (the stop button's SIGINT, a stop forwarded by the kit or the emulator)
  goes on to the fork's process group, as the stop button sends it to a kernel's; Jupyter's own
  interrupt goes by message (see the kernelspec). One difference stays: whoever
  signals each of a kernel's descendants (the kit's cancel, the emulator's stop) reaches torchrun
  and its workers, in sessions of their own, only through the kernel, which passes a stop on;
- a launcher killed (or left by its parent) takes the kernel and everything below it down;
- the launcher exits as the kernel did.

A kernel whose environment would have changed what the server imported (its Python path, a
`sitecustomize`, thread or library settings) is started as usual instead (`execv`), as is any kernel
where the server is not running. Nothing of the kit knows about this: it is a kernelspec.
"""
from __future__ import annotations

import array
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

# Not LAB_ or KAGGLE_: the Kaggle emulator keeps those out of its sessions.
SOCKET_ENV = "FORKED_KERNELS_SOCKET"
# Environment that changes what an import does: a kernel that differs from the server in any of
# these starts the usual way.
SAME_NAMES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONNOUSERSITE", "PYTHONSAFEPATH",
              "PYTHONDONTWRITEBYTECODE", "LD_PRELOAD", "LD_LIBRARY_PATH")
SAME_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH_")
# Read when a compile runs, not at import (and set by inductor in the test process once it compiled).
READ_LATER = ("TORCHINDUCTOR_CACHE_DIR",)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# The server ignores these (a stop sent to a test's descendants is not for it); its kernels do not.
IGNORED_BY_THE_SERVER = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def install_kernelspec(where: Path) -> Path:
    """A `python3` kernelspec under `where/kernels` that starts kernels through `launch`; put
    `where` first on JUPYTER_PATH."""
    spec = where / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    # "ipykernel" in the launcher's command line (and nowhere in the server's, which its forks
    # keep): tests find the kernel among a process's descendants by it.
    argv = [sys.executable, str(Path(__file__).resolve()), "ipykernel_launcher", "-f", "{connection_file}"]
    # Jupyter's interrupt by message: the kernel signals its own group, in order with the messages
    # that follow (jupyter_client interrupts before each shutdown request). By signal it would pass
    # through the launcher and could land while the kernel already handles the next message.
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3 (ipykernel)",
                                                  "language": "python", "interrupt_mode": "message"}),
                                      encoding="utf-8")
    return where


def _import_relevant(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if (k in SAME_NAMES or k.startswith(SAME_PREFIXES)) and k not in READ_LATER}


# ---- the server -----------------------------------------------------------------------------

def serve(path: str) -> None:
    """Imports what every kernel imports, then forks a kernel for each launcher that asks."""
    import ipykernel.kernelapp  # noqa: F401
    import torch._dynamo  # noqa: F401 - torch with it
    # Out of the collector's sight: otherwise each fork's collections walk every object these imports
    # made, writing to (and so copying) their pages, and a fork cost more than a fresh process.
    gc.freeze()
    for sig in IGNORED_BY_THE_SERVER:
        signal.signal(sig, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)  # to whoever started the server: it takes kernels now
    picker = selectors.DefaultSelector()
    picker.register(listener, selectors.EVENT_READ)
    kernels: dict[int, socket.socket] = {}  # a kernel's pid → its launcher's connection
    parent = os.getppid()
    while os.getppid() == parent:  # the test process is gone: so is the server
        for key, _ in picker.select(timeout=0.2):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = _fork_kernel(conn, listener, picker, kernels)
                if pid:
                    kernels[pid] = conn
                    picker.register(conn, selectors.EVENT_READ, pid)
            else:  # the launcher was killed before its kernel ended: so is the kernel
                _kill_kernel(key.data)
                picker.unregister(key.fileobj)
        _reap(kernels, picker)
    for pid in kernels:
        _kill_kernel(pid)


def _fork_kernel(conn: socket.socket, listener, picker, kernels: dict) -> int | None:
    request, fds = _receive(conn)
    if request is None:
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the kernel
        try:
            os.setsid()
            picker.close()
            listener.close()
            for other in kernels.values():
                other.close()
            conn.close()
            _become_kernel(request, fds)
        except SystemExit:  # the kernel's end: up and out as any kernel process ends (atexit included)
            raise
        except BaseException:  # noqa: BLE001 - whatever else happens, the fork never returns to the loop
            import traceback
            traceback.print_exc()
            sys.stdout.flush()  # os._exit flushes nothing, and the traceback is the one trace left
            sys.stderr.flush()
            os._exit(1)
    for fd in fds:
        os.close(fd)
    while True:  # its session exists before anyone is told to signal it
        try:
            if os.getpgid(pid) == pid:
                break
        except ProcessLookupError:
            break
        time.sleep(0.001)
    conn.sendall(f"pid {pid}\n".encode())
    return pid


def _become_kernel(request: dict, fds: list[int]) -> None:
    """The launcher's process, as far as Python can tell: its streams, environment, folder and
    signals; then the kernel."""
    env = request["env"]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    import tempfile
    tempfile.tempdir = None  # the kernel's own TMPDIR, not the server's
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    for sig in IGNORED_BY_THE_SERVER:  # as a fresh Python has them
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    # ipykernel reads its parent from JPY_PARENT_PID when it is imported: in the server, where it is unset.
    parent = [f"--IPKernelApp.parent_handle={env['JPY_PARENT_PID']}"] if "JPY_PARENT_PID" in env else []
    sys.argv = ["ipykernel_launcher", *request["argv"], *parent]
    sys.path[0] = request["cwd"]  # as `python -m ipykernel_launcher` started there would have it
    from ipykernel import kernelapp
    kernelapp.launch_new_instance()
    raise SystemExit(0)


def _reap(kernels: dict, picker) -> None:
    while kernels:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = kernels.pop(pid, None)
        if conn is None:
            continue
        try:
            picker.unregister(conn)
        except (KeyError, ValueError):
            pass
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}")
        try:
            conn.sendall(f"{how}\n".encode())
        except OSError:
            pass
        conn.close()


def _kill_kernel(pid: int) -> None:
    """SIGKILL to the kernel's group and all below it (torchrun and its workers run in sessions of
    their own), as a killed kernel's tree would be killed."""
    from lab.procs import descendants, signal_quietly
    below = descendants(pid)
    _kill_group(pid, signal.SIGKILL)
    for child in below:
        signal_quietly(child, signal.SIGKILL)


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _receive(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """One request: its length, then the JSON with the launcher's three standard streams."""
    data, fds = b"", []
    fd_size = array.array("i").itemsize
    while b"\n" not in data:
        chunk, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fd_size))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[:len(payload) - len(payload) % fd_size]))
        if not chunk:
            return None, fds
        data += chunk
    length, _, rest = data.partition(b"\n")
    while len(rest) < int(length):
        chunk = conn.recv(65536)
        if not chunk:
            return None, fds
        rest += chunk
    return json.loads(rest), fds


# ---- the launcher ---------------------------------------------------------------------------

def launch(argv: list[str]) -> None:
    """Stands in for the kernel the server forks; starts one the usual way where it cannot."""
    path = os.environ.get(SOCKET_ENV)
    usual = [sys.executable, "-m", "ipykernel_launcher", *argv]
    if not path or _import_relevant(os.environ) != _server_env(path):
        os.execv(sys.executable, usual)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        os.execv(sys.executable, usual)
    body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    conn.sendmsg([f"{len(body)}\n".encode() + body],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    replies = conn.makefile("r")
    pid = int(replies.readline().split()[1])
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _: _kill_group(pid, s))
    parent = os.getppid()

    def leave_with_the_parent(*_) -> None:  # as ipykernel's poller would: the server then ends the kernel
        if os.getppid() != parent:
            os._exit(1)

    signal.signal(signal.SIGALRM, leave_with_the_parent)
    signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)
    how = replies.readline().split() or ["signal", str(int(signal.SIGKILL))]
    signal.setitimer(signal.ITIMER_REAL, 0)
    if how[0] == "exit":
        os._exit(int(how[1]))
    sig = int(how[1])
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def passed_on() -> dict[str, str]:
    """What a session started elsewhere on this machine (an SSH box's) needs for its kernels to fork
    as this process's do: the server's socket and kernelspec, and the environment its imports
    depend on. Nothing where the server is not running."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return {}
    return {**_server_env(path), SOCKET_ENV: path, "JUPYTER_PATH": os.environ.get("JUPYTER_PATH", "")}


def _server_env(path: str) -> dict:
    try:
        return json.loads(Path(path + ".env").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"unreadable": "start kernels the usual way"}


def start_server(where: Path):
    """Starts the server for this test process (its socket and environment under `where`);
    returns the process. Kernels started by this process and its children use it."""
    import subprocess
    path = str(where / "kernels.sock")
    os.environ[SOCKET_ENV] = path
    Path(path + ".env").write_text(json.dumps(_import_relevant(os.environ)), encoding="utf-8")
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", path],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    if server.stdout.readline().strip() != "ready":
        os.environ.pop(SOCKET_ENV)
        raise RuntimeError("the test kernels' server did not start")
    return server


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:  # ipykernel_launcher
        launch(sys.argv[2:])
