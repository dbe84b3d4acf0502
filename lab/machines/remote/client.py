"""The person's own OpenSSH client (`ssh`, `rsync -e ssh`, `sftp` with their keys, agent and `~/.ssh/config`;
`LAB_SSH_CONFIG=FILE`: that config instead), and a host of the lab's own machines reached through it (`Shell`:
a box, a Slurm login node, or this computer itself). The kit adds only `BatchMode=yes` (no password is ever
asked for, and an unknown or changed host key is refused) and timeouts that find a dead connection in seconds.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab.config import UserError
from lab.machines.remote import half

CONFIG_ENV = "LAB_SSH_CONFIG"
CONNECT_TIMEOUT_S = 10
ALIVE_S, ALIVE_COUNT = 10, 3  # a connection that answers nothing for 30 s is dead
SSH_FAILED = 255  # ssh's own exit status when the connection (not the remote command) failed
NOT_FOUND = 127  # the shell's status for a command it did not find
COPY_TIMEOUT_S = 3600.0  # one copy at most; a copy stopped by it resumes where it stopped
HALF = Path(half.__file__).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Address:
    """Where one host is: `[user@]host` or an alias of the ssh config, and a port if given."""
    host: str
    port: int | None = None

    def __str__(self) -> str:
        return self.host + (f" (port {self.port})" if self.port else "")

    @classmethod
    def from_dict(cls, d: dict) -> "Address":
        return cls(str(d["host"]), int(d["port"]) if d.get("port") else None)


def parse_hosts(ssh: str | None, hosts: str | None, port: int | None) -> list[Address]:
    """The hosts of `--ssh [USER@]HOST` or `--hosts H1,H2,...`, each with `--port` if given."""
    if bool(ssh) == bool(hosts):
        raise UserError("give the machine's host: --ssh [USER@]HOST for one box, or --hosts H1,H2,... for a group")
    names = [ssh] if ssh else [h.strip() for h in hosts.split(",") if h.strip()]
    for host in names:
        if not re.fullmatch(r"[A-Za-z0-9_.@%:\[\]-]+", host) or host.startswith("-"):
            raise UserError(f"{host!r} is not a host as ssh takes it ([USER@]HOST, or an alias of your ssh config)")
    if len(set(names)) != len(names):
        raise UserError(f"a host is named twice in --hosts {hosts}: each host of a group trains its own part")
    if port is not None and not 0 < port < 65536:
        raise UserError(f"--port {port} is not a TCP port (1-65535)")
    return [Address(host, port) for host in names]


class SshError(UserError):
    """A connection to a box failed. `kind`: unreachable, host-key, auth or lost."""
    def __init__(self, address: Address, kind: str, message: str):
        self.address, self.kind = address, kind
        super().__init__(message)


def options() -> list[str]:
    config = os.environ.get(CONFIG_ENV, "").strip()  # the person's own where unset (a lab-wide file, a test's)
    if config and not Path(config).expanduser().is_file():
        raise UserError(f"{CONFIG_ENV}={config}: no such file; point it at an ssh config, or unset it to use your own")
    return (["-F", str(Path(config).expanduser())] if config else []) + [
        "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", f"ServerAliveInterval={ALIVE_S}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}"]


def client(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise UserError(f"the OpenSSH client's `{name}` is not installed here: install it (Debian/Ubuntu: "
                        "apt install openssh-client) and check that `ssh HOST` works")
    return found


def python_word(python: str) -> str:
    """The box's Python as a word of the remote shell: `~/` still means the remote home."""
    return '"$HOME"/' + shlex.quote(python[2:]) if python.startswith("~/") else shlex.quote(python)


def connection_error(address: Address, stderr: str) -> SshError:
    text, host = stderr.strip(), address.host
    last = last_line(text) or "ssh failed without a message"
    if "IDENTIFICATION HAS CHANGED" in text or "Host key for" in text and "has changed" in text:
        return SshError(address, "host-key", (
            f"{address}: its host key is not the one your known_hosts holds: the box was reinstalled, or "
            f"someone is in between. Ask the box's owner for its key's fingerprint; if it is right, remove "
            f"the old key (`ssh-keygen -R {host}`) and accept the new one with `ssh {host}` once"))
    if "Host key verification failed" in text or "host key is known" in text:
        return SshError(address, "host-key", (
            f"{address}: its host key is not known here yet, and the kit accepts none on its own: run "
            f"`ssh {host}` once, check the fingerprint it shows, and accept it"))
    if "Permission denied" in text:
        return SshError(address, "auth", (
            f"{address}: the box refused your key ({last}): add your public key to its authorized_keys "
            f"(`ssh-copy-id {host}`) or load it into your agent (`ssh-add`); the kit asks for no password"))
    if any(s in text for s in ("Connection refused", "timed out", "No route to host", "Could not resolve",
                               "Network is unreachable", "Name or service not known")):
        return SshError(address, "unreachable", (
            f"{address}: cannot reach it ({last}): is the box on and on the network, and does `ssh {host}` "
            f"work from here?"))
    return SshError(address, "lost", f"{address}: the connection failed ({last}); check that `ssh {host}` works")


def ssh_command(address: Address) -> list[str]:
    """ssh with the kit's options and the address's port, before the host."""
    return [client("ssh"), *options(), *(["-p", str(address.port)] if address.port else [])]


def _sftp(address: Address, lines: list[str]) -> None:
    # sftp takes ssh's -o options; its port flag is -P, and "-b -" reads the batch from stdin
    # (a failing command ends the batch with a non-zero status).
    if lines:
        _copy(address, [client("sftp"), *options(), *(["-P", str(address.port)] if address.port else []), "-q", "-b",
                        "-", address.host], "\n".join(lines) + "\n")


def _sftp_quote(path: str) -> str:
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _copy(address: Address, cmd: list[str], stdin: str | None = None) -> None:
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=COPY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SshError(address, "lost", f"{address}: a copy took longer than {COPY_TIMEOUT_S / 60:.0f} min; it "
                                        "resumes where it stopped when tried again") from None
    if proc.returncode == 0:
        return
    text = (proc.stderr or proc.stdout).strip()
    if "No space left on device" in text or "Disk quota exceeded" in text:
        raise UserError(f"{address}: the copy ran out of disk space on the box ({text.splitlines()[-1]}): "
                        "free some space there, or give the machine another --workdir")
    if proc.returncode == SSH_FAILED or "Connection closed" in text or "connection unexpectedly closed" in text:
        raise connection_error(address, text)
    raise UserError(f"{address}: copying failed ({last_line(text) or f'exit {proc.returncode}'})")


@dataclass(frozen=True)
class Shell:
    """A host as the kit reaches it (`address` None: this computer); `owner` names the machine in messages."""
    address: Address | None
    python: str
    owner: str = "the machine"
    name: str = "NAME"

    @property
    def label(self) -> str:
        return "this computer" if self.address is None else self.address.host

    def run(self, argv: list[str], stdin: str | None = None, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """`argv` on the host; the connection's own failure raises SshError, a command not found there is 127."""
        if self.address is None:
            return _here(argv, stdin, timeout_s)
        command = " ".join(python_word(argv[0]) if i == 0 else shlex.quote(a) for i, a in enumerate(argv))
        try:
            proc = subprocess.run([*ssh_command(self.address), self.address.host, command], input=stdin,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SshError(self.address, "lost", f"{self.address}: no answer within {timeout_s:.0f} s; check that "
                                                 f"`ssh {self.address.host}` works, then try again") from None
        if proc.returncode == SSH_FAILED:
            raise connection_error(self.address, proc.stderr)
        return proc

    def helper(self, verb: str, *args: str, timeout_s: float = 120.0) -> dict:
        return self.answer(self.run([self.python, "-", verb, *args], stdin=HALF, timeout_s=timeout_s), verb)

    def answer(self, proc: subprocess.CompletedProcess, verb: str) -> dict:
        """The JSON answer of the half's `verb`, or what went wrong, said with what to do."""
        if proc.returncode in (126, NOT_FOUND):
            raise UserError(f"{self.owner}: there is no Python at {self.python} on {self.label} "
                            f"({last_line(proc.stderr) or 'not found'}): give the machine's Python (`"
                            + (f"ssh {self.address.host} " if self.address else "") + "which python3` finds one; on a "
                            f"cluster, a path on its shared file system) with `lab machines remove {self.name}` and "
                            f"`lab machines add {self.name} ... --python PATH`")
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            why = last_line(proc.stderr) or f"exit {proc.returncode}"
            if "No space left on device" in proc.stderr or "Disk quota exceeded" in proc.stderr:
                raise UserError(f"{self.owner}: the disk of {self.label} is full ({why}): free some space in the "
                                "kit's workdir there, or give the machine another --workdir")
            raise UserError(f"{self.owner}: `{verb}` failed on {self.label}: {why}")
        return json.loads(lines[-1])

    def copy_up(self, local: Path, remote: str, rsync: bool, there: dict[str, int]) -> None:
        """Copies the folder `local` into `remote` (absolute, on the host), resumable: rsync where both sides have
        it, else sftp; `there` (relative path -> size, already there): a whole one is skipped, a shorter continued."""
        address = self.address
        if address is None:
            for path in sorted(local.rglob("*")):
                rel = path.relative_to(local).as_posix()
                dest = Path(remote) / rel
                if path.is_dir():
                    dest.mkdir(parents=True, exist_ok=True)
                elif there.get(rel) != path.stat().st_size:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, dest)
            return
        if rsync and shutil.which("rsync"):
            _copy(address, [client("rsync"), "-a", "--partial", "--protect-args", "-e",
                            shlex.join(ssh_command(address)), f"{local}/", f"{address.host}:{remote}/"])
            return
        lines = []
        for path in sorted(local.rglob("*")):
            rel = path.relative_to(local).as_posix()
            dest = _sftp_quote(f"{remote}/{rel}")
            if path.is_dir():
                lines.append(f"-mkdir {dest}")
            elif rel not in there:
                lines.append(f"put {_sftp_quote(str(path))} {dest}")
            elif there[rel] < path.stat().st_size:
                lines.append(f"reput {_sftp_quote(str(path))} {dest}")
        _sftp(address, lines)

    def copy_down(self, remote: str, files: dict[str, int | None], local: Path, rsync: bool) -> None:
        """Copies `files` (relative to `remote`, with their sizes; None: whole) into `local`, resumable the same way."""
        address = self.address
        if address is None:
            for rel, size in sorted(files.items()):
                src, dest = Path(remote) / rel, local / rel
                if not src.is_file() or dest.is_file() and size is not None and dest.stat().st_size == size:
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
            return
        if not files:
            return
        local.mkdir(parents=True, exist_ok=True)
        if rsync and shutil.which("rsync"):
            _copy(address, [client("rsync"), "-a", "--partial", "--protect-args", "--files-from=-", "-e",
                            shlex.join(ssh_command(address)), f"{address.host}:{remote}/", f"{local}/"],
                  "".join(f"{rel}\n" for rel in sorted(files)))
            return
        lines = []
        for rel, size in sorted(files.items()):
            here = local / rel
            here.parent.mkdir(parents=True, exist_ok=True)
            have = here.stat().st_size if here.is_file() else None
            if size is None or have != size:
                verb = "reget" if size is not None and have is not None and have < size else "get"
                lines.append(f"{verb} {_sftp_quote(f'{remote}/{rel}')} {_sftp_quote(str(here))}")
        _sftp(address, lines)

    def read(self, path: str) -> str:  # its last 256 KiB
        proc = self.run(["tail", "-c", str(256 * 1024), path], timeout_s=60)
        return proc.stdout if proc.returncode == 0 else ""

    def remove(self, path: str, under: str) -> None:
        """Removes the folder `path` on the host, inside the kit's `under`, and its parent once empty."""
        if not path.startswith(under.rstrip("/") + "/") or "/../" in path or path.endswith("/.."):
            raise ValueError(f"{path} is not inside {under}")
        self.run(["sh", "-c", 'rm -rf -- "$1" && rmdir -- "$2" 2>/dev/null; true', "sh", path,
                  path.rstrip("/").rsplit("/", 1)[0]], timeout_s=300)


def _here(argv: list[str], stdin: str | None, timeout_s: float) -> subprocess.CompletedProcess:
    program = os.path.expanduser(argv[0])
    try:
        return subprocess.run([program, *argv[1:]], input=stdin, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, NOT_FOUND, "", f"{argv[0]}: command not found")
    except PermissionError as e:
        return subprocess.CompletedProcess(argv, 126, "", f"{argv[0]}: {e}")
    except subprocess.TimeoutExpired:
        raise UserError(f"`{argv[0]}` gave no answer on this computer within {timeout_s:.0f} s") from None


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]
