"""Fixtures for the lab's SSH machines: real OpenSSH servers on this machine's loopback.

`ssh_lab` (one per test session) starts Debian's sshd twice, on two free loopback ports, each
with its own sshd_config (`-D -e`), a throwaway host key and one throwaway user key in a temp
AuthorizedKeysFile; and it writes a test ssh config (the kit reads it through LAB_SSH_CONFIG)
whose known_hosts holds exactly those host keys:

    box-a, box-b   the two servers (both are this machine: their "box" Python is this
                   checkout's .venv/bin/python, each test gives its own --workdir)
    box-rekeyed    box-a's server, with another key for it in known_hosts (a changed host key)
    box-off        a loopback port where nothing listens (an unreachable host)

Host-key checking stays on: the config sets no StrictHostKeyChecking at all. The sessions get
OMP_NUM_THREADS=1 through SetEnv/AcceptEnv, as the tests' own processes have it (fast on two
cores, and bitwise repeatable), and what the test process's forked kernels need (their server's
socket and kernelspec, the environment it compares: tests/forked_kernels.py), so that a box's
session forks its kernel as this computer's sessions do.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from tests.forked_kernels import passed_on

SSHD = Path("/usr/sbin/sshd")
PYTHON = str(Path(sys.executable))  # this checkout's .venv python: the boxes' Python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab-test", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@dataclass
class Sshd:
    port: int
    host_key: str  # "ssh-ed25519 AAAA..." as known_hosts holds it
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sshd(folder: Path, authorized: Path, extra: tuple[str, ...] = ()) -> Sshd:
    """sshd on a free loopback port; `extra`: more sshd_config lines (a `SetEnv` for its sessions)."""
    folder.mkdir(parents=True)
    host_key = _keygen(folder / "host_key")
    port = free_port()
    config = folder / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host_key'}",
        f"AuthorizedKeysFile {authorized}", "PidFile none", "StrictModes no", "UsePAM no",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        f"AcceptEnv {' '.join(_passed_on())}", "Subsystem sftp internal-sftp", "LogLevel ERROR", *extra]) + "\n")
    log = open(folder / "sshd.log", "wb")
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return Sshd(port, host_key, proc)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not start: {(folder / 'sshd.log').read_text()}")


@dataclass
class SshLab:
    root: Path
    config: Path  # the test ssh config: LAB_SSH_CONFIG
    servers: dict[str, Sshd]
    python: str = PYTHON
    workdirs: list[Path] = field(default_factory=list)

    def workdir(self, name: str) -> Path:
        """A fresh folder for a box's --workdir (its runs' sessions are ended at the end)."""
        path = self.root / "workdirs" / name
        path.mkdir(parents=True)
        self.workdirs.append(path)
        return path

    def end_sessions(self) -> None:
        """Ends every box session the tests started that is still alive (by its recorded pid)."""
        import json
        for w in self.workdirs:
            for runner in w.glob("runs/*/*/runner.json"):
                pid = json.loads(runner.read_text())["pid"]
                try:
                    if str(runner.parent).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _passed_on() -> dict[str, str]:
    """What the boxes' sessions get from the tests: one thread each, and their kernels forked."""
    return {**passed_on(), "OMP_NUM_THREADS": "1"}


def _ssh_config(root: Path, servers: dict[str, Sshd], user_key: Path) -> Path:
    known = root / "known_hosts"
    other = _keygen(root / "other_host_key")  # the "changed" key box-rekeyed's known_hosts entry holds
    known.write_text("".join(f"[127.0.0.1]:{s.port} {s.host_key}\n" for s in servers.values())
                     + f"box-rekeyed {other}\n")
    common = [f"  User {os.environ.get('USER') or 'root'}", f"  IdentityFile {user_key}", "  IdentitiesOnly yes",
              f"  UserKnownHostsFile {known}", "  GlobalKnownHostsFile /dev/null",
              "  SetEnv " + " ".join(f"{name}={value}" for name, value in _passed_on().items())]
    blocks = {"box-a": ["  HostName 127.0.0.1", f"  Port {servers['a'].port}"],
              "box-b": ["  HostName 127.0.0.1", f"  Port {servers['b'].port}"],
              "box-rekeyed": ["  HostName 127.0.0.1", f"  Port {servers['a'].port}", "  HostKeyAlias box-rekeyed"],
              "box-off": ["  HostName 127.0.0.1", f"  Port {free_port()}"]}
    config = root / "ssh_config"
    config.write_text("".join(f"Host {name}\n" + "\n".join(lines + common) + "\n" for name, lines in blocks.items()))
    return config


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory) -> Iterator[SshLab]:
    if not SSHD.is_file() or not shutil.which("ssh"):
        pytest.skip("Debian's openssh-server is not installed here: ./scripts/install-test-deps installs it")
    root = tmp_path_factory.mktemp("ssh-lab")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    user_key = root / "user_key"
    _keygen(user_key)
    authorized = root / "authorized_keys"
    shutil.copyfile(user_key.with_suffix(".pub"), authorized)
    servers = {name: start_sshd(root / f"sshd-{name}", authorized) for name in ("a", "b")}
    lab = SshLab(root, _ssh_config(root, servers, user_key), servers)
    previous = {k: os.environ.get(k) for k in ("LAB_SSH_CONFIG", "LAB_SSH_POLL_S")}
    os.environ.update(LAB_SSH_CONFIG=str(lab.config), LAB_SSH_POLL_S="0.5")
    try:
        yield lab
    finally:
        lab.end_sessions()
        for server in servers.values():
            server.stop()
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["ssh_lab", "SshLab", "free_port", "start_sshd", "PYTHON"]
