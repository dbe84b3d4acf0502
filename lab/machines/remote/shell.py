"""One of the lab's own hosts as the kit reaches it: a box, or a Slurm cluster's login node, over the
person's OpenSSH client (lab.machines.remote.client), or this computer itself (`--slurm local`). The kit's
half (lab.machines.remote.half) runs there with the host's own Python and answers one JSON line; a Python
that is not there, or a full disk, is one clear error that says what to do.
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
from lab.machines.remote import half
from lab.machines.remote.client import (SSH_FAILED, Address, SshError, connection_error, copy_down, copy_up,
                                        python_word, ssh_argv)

HALF = Path(half.__file__).read_text(encoding="utf-8")
NOT_FOUND = 127  # the shell's status for a command it did not find


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
            proc = subprocess.run(ssh_argv(self.address, command), input=stdin, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SshError(self.address, "lost", f"{self.address}: no answer within {timeout_s:.0f} s; check that "
                                                 f"`ssh {self.address.host}` works, then try again") from None
        if proc.returncode == SSH_FAILED:
            raise connection_error(self.address, proc.stderr)
        return proc

    def helper(self, verb: str, *args: str, timeout_s: float = 120.0) -> dict:
        """One verb of the kit's half with the host's Python, its JSON answer."""
        return self.answer(self.run([self.python, "-", verb, *args], stdin=HALF, timeout_s=timeout_s), verb)

    def answer(self, proc: subprocess.CompletedProcess, verb: str) -> dict:
        """The JSON answer of the half's `verb`, or what went wrong, said with what to do."""
        if proc.returncode in (126, NOT_FOUND):
            raise UserError(f"{self.owner}: there is no Python at {self.python} on {self.label} "
                            f"({_last(proc.stderr) or 'not found'}): give the machine's Python (`"
                            + (f"ssh {self.address.host} " if self.address else "") + "which python3` finds one; on a "
                            f"cluster, a path on its shared file system) with `lab machines remove {self.name}` and "
                            f"`lab machines add {self.name} ... --python PATH`")
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            why = _last(proc.stderr) or f"exit {proc.returncode}"
            if "No space left on device" in proc.stderr or "Disk quota exceeded" in proc.stderr:
                raise UserError(f"{self.owner}: the disk of {self.label} is full ({why}): free some space in the "
                                "kit's workdir there, or give the machine another --workdir")
            raise UserError(f"{self.owner}: `{verb}` failed on {self.label}: {why}")
        return json.loads(lines[-1])

    def copy_up(self, local: Path, remote: str, rsync: bool, there: dict[str, int]) -> None:
        """The folder `local` into `remote` on the host (lab.machines.remote.client.copy_up)."""
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
        """`files` (relative to the host's folder `remote`, with their sizes) into `local`."""
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
        """The end of a text file on the host ("" when there is none)."""
        proc = self.run(["tail", "-c", str(max_bytes), path], timeout_s=60)
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


def _last(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""
