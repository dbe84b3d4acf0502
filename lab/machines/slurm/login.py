"""Where the kit runs a cluster's commands: this computer when it is the login node (`--slurm
local`), else the login node over the person's own OpenSSH client (lab.machines.ssh.client: their
keys, agent, `ProxyJump` and aliases; BatchMode, host keys checked).

Slurm's commands (sbatch, squeue, scontrol, sinfo, sacct, scancel) run as they are; the kit's
small helpers run with the cluster's Python (the box's half, lab.machines.ssh.remote, sent on
stdin; or a link's copy of the cluster's half, lab.machines.slurm.node). Files go up and come
back as a box's do (rsync, else sftp), or are copied here when the login node is this computer.
A command that is not there (no `sbatch` on this computer, no Python at the path given) is one
clear error that says what to do.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab.config import UserError
from lab.machines.ssh import remote as ssh_remote
from lab.machines.ssh.client import (SSH_FAILED, Address, SshError, connection_error, copy_down, copy_up,
                                     python_word, ssh_argv)

REMOTE = Path(ssh_remote.__file__).read_text(encoding="utf-8")  # the box's half: hello, stage, seal, outputs
NOT_FOUND = 127  # the shell's status for a command it did not find


@dataclass(frozen=True)
class Login:
    """The cluster's login node as the kit reaches it: `address` None is this computer."""
    address: Address | None
    python: str

    @property
    def label(self) -> str:
        return "this computer" if self.address is None else self.address.host

    def run(self, argv: list[str], stdin: str | None = None, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """`argv` on the login node; its output as text. The connection's own failure raises
        SshError; a command not found there comes back with status 127."""
        if self.address is None:
            return _here(argv, stdin, timeout_s)
        command = " ".join(python_word(argv[0]) if i == 0 else shlex.quote(a) for i, a in enumerate(argv))
        try:
            proc = subprocess.run(ssh_argv(self.address, command), input=stdin, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SshError(self.address, "lost", f"{self.address}: no answer within {timeout_s:.0f} s; check that "
                                                 f"`ssh {self.address.host}` works, then try again") from None
        if proc.returncode == SSH_FAILED:
            raise connection_error(self.address, proc.stderr)
        return proc

    def slurm(self, argv: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """One of Slurm's commands; its absence is an error that says where it is missing."""
        proc = self.run(argv, timeout_s=timeout_s)
        if proc.returncode == NOT_FOUND and ("not found" in proc.stderr or not proc.stderr.strip()):
            where = "this computer" if self.address is None else f"the login node {self.address.host}"
            hint = ("is this the cluster's login node? Install Slurm's client commands here (Debian: apt install "
                    "slurm-client), or add the cluster with --slurm [USER@]LOGIN_HOST") if self.address is None else (
                    f"does `ssh {self.address.host} {argv[0]} --version` work? Slurm's commands must be on the PATH "
                    "of a non-interactive ssh session there")
            raise UserError(f"there is no `{argv[0]}` on {where}: {hint}")
        return proc

    def helper(self, verb: str, *args: str, timeout_s: float = 120.0) -> dict:
        """One verb of the box's half (lab.machines.ssh.remote) with the cluster's Python, its JSON
        answer."""
        return self._answer(self.run([self.python, "-", verb, *args], stdin=REMOTE, timeout_s=timeout_s), verb)

    def node(self, script: str, verb: str, *args: str, timeout_s: float = 120.0) -> dict:
        """One verb of a link's copy of the cluster's half (`script`, a path there), its JSON answer."""
        return self._answer(self.run([self.python, script, verb, *args], timeout_s=timeout_s), verb)

    def _answer(self, proc: subprocess.CompletedProcess, verb: str) -> dict:
        if proc.returncode in (126, NOT_FOUND):
            raise UserError(f"there is no Python at {self.python} on {self.label} "
                            f"({_last(proc.stderr) or 'not found'}): give the cluster's Python (a path on its "
                            "shared file system, with torch and papermill) with `lab machines remove NAME` and "
                            "`lab machines add NAME ... --python PATH`")
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            why = _last(proc.stderr) or f"exit {proc.returncode}"
            if "No space left on device" in proc.stderr or "Disk quota exceeded" in proc.stderr:
                raise UserError(f"{self.label}: the cluster's disk is full ({why}): free some space in the kit's "
                                "workdir there, or give the cluster another --workdir")
            raise UserError(f"{self.label}: `{verb}` failed: {why}")
        return json.loads(lines[-1])

    def copy_up(self, local: Path, remote: str, rsync: bool, there: dict[str, int]) -> None:
        """The folder `local` into `remote` (absolute, on the cluster), resumable as a box's copy."""
        if self.address is not None:
            copy_up(self.address, local, remote, rsync, there)
            return
        for path in sorted(local.rglob("*")):
            rel = path.relative_to(local).as_posix()
            dest = Path(remote) / rel
            if path.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
            elif there.get(rel) != path.stat().st_size:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)

    def copy_down(self, remote: str, files: dict[str, int | None], local: Path, rsync: bool) -> None:
        """`files` (relative to the cluster's folder `remote`, with their sizes) into `local`."""
        if self.address is not None:
            copy_down(self.address, remote, files, local, rsync)
            return
        for rel, size in sorted(files.items()):
            src, dest = Path(remote) / rel, local / rel
            if not src.is_file() or dest.is_file() and size is not None and dest.stat().st_size == size:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)

    def read(self, path: str, max_bytes: int = 256 * 1024) -> str:
        """The end of a text file on the cluster ("" when there is none)."""
        proc = self.run(["tail", "-c", str(max_bytes), path], timeout_s=60)
        return proc.stdout if proc.returncode == 0 else ""

    def remove(self, path: str, under: str) -> None:
        """Removes the folder `path` on the cluster, which must lie inside the kit's `under`, and
        its parent folder once it is empty."""
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
        raise UserError(f"`{argv[0]}` gave no answer on this computer within {timeout_s:.0f} s: is Slurm's "
                        "controller up (`sinfo`)?") from None


def _last(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""
