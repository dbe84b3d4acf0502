"""A real one-node Slurm cluster on this machine, for the lab's Slurm machines' tests.

`slurm_cluster` (one per test session) starts Debian's munged with a throwaway key, then
slurmctld and slurmd in the foreground (`-D`) with a slurm.conf of its own in a temp folder: free
loopback ports, the state and spool folders there, SlurmUser and SlurmdUser the user the tests run
as, no cgroups (proctrack/linuxproc, task/none), no accounting (no slurmdbd: `sacct` says
accounting storage is disabled, so the kit reads `scontrol` and the job's own files), one node
`labnode` with 4 CPUs as the config says (config_overrides: the node is not drained on a
smaller machine), allocated by CPU, and two partitions:

    debug    the default, up; MaxTime 60 min; PreemptMode REQUEUE (preempt/partition_prio)
    spare    down at the start: a job sent there waits with Slurm's reason PartitionDown

MinJobAge keeps a finished job in `scontrol` for 10 minutes; KillWait gives a signalled job 15 s
to save before SIGKILL. Every Slurm command the tests and the kit run finds it by SLURM_CONF. The
daemons are ended by their pids at the session's end.

Without the binaries (`./scripts/install-test-deps` installs slurmctld, slurmd, slurm-client and
munge) the tests skip, saying so; with LAB_REQUIRE_SLURM=1 (as `.ci/run` sets it) they fail
instead, so a CI that lost them cannot pass by skipping.

`slurm_login` adds a login node over ssh: an sshd of its own on a loopback port (ssh_fixtures)
whose sessions get SLURM_CONF (sshd's SetEnv), and an ssh config with its alias `slurm-login`
for the kit (LAB_SSH_CONFIG).
"""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from ssh_fixtures import _keygen, free_port, start_sshd

MUNGED, SLURMCTLD, SLURMD = Path("/usr/sbin/munged"), Path("/usr/sbin/slurmctld"), Path("/usr/sbin/slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "sacct", "srun")
NODE = "labnode"


def missing() -> list[str]:
    found = [str(p) for p in (MUNGED, SLURMCTLD, SLURMD) if not p.is_file()]
    return found + [c for c in CLIENTS if shutil.which(c) is None]


def slurm_conf(root: Path, user: str, munge_socket: Path) -> str:
    lines = [
        "ClusterName=labtest", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}", f"SlurmUser={user}", f"SlurmdUser={user}", "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}", "CredType=cred/munge", f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}", f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}", f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "MpiDefault=none", "SlurmdParameters=config_overrides", "ReturnToService=2",
        "MinJobAge=600", "KillWait=15", "InactiveLimit=0", "MessageTimeout=20",
        "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE", "JobRequeue=1",
        f"NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=2000 State=UNKNOWN",
        f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=60 State=UP",
        f"PartitionName=spare Nodes={NODE} MaxTime=60 State=DOWN"]
    return "\n".join(lines) + "\n"


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True) -> str:
        """A Slurm command as the cluster's admin types it (scontrol, sbatch, ...), its stdout."""
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {proc.stderr or proc.stdout}")
        return proc.stdout

    def job(self, job: str) -> dict:
        """`scontrol show job`'s fields for the job."""
        from lab.machines.slurm.query import scontrol_fields
        return scontrol_fields(self.run("scontrol", "show", "job", "-o", job).strip())

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _start(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    log = open(cluster.root / f"{name}.out", "wb")
    cluster.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_up(cluster: SlurmCluster, timeout_s: float = 60.0) -> None:
    """Until the node is idle in the default partition (slurmd registered with slurmctld)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}: {(cluster.root / f'{name}.out').read_text()}")
        out = subprocess.run(["sinfo", "-h", "-p", "debug", "-o", "%T"], capture_output=True, text=True).stdout
        if out.strip() in ("idle", "mixed", "allocated"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the test cluster did not come up: {(cluster.root / 'slurmctld.out').read_text()[-2000:]}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    absent = missing()
    if absent:
        why = (f"Slurm is not installed here ({', '.join(absent)} missing): ./scripts/install-test-deps installs "
               "Debian's slurmctld, slurmd, slurm-client and munge")
        if os.environ.get("LAB_REQUIRE_SLURM") == "1":
            pytest.fail(why + " (LAB_REQUIRE_SLURM=1: these tests must run)")
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o700)  # munged refuses a key or a socket others may reach
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    socket_path = root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, getpass.getuser(), socket_path))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    cluster = SlurmCluster(root, conf)
    try:
        _start(cluster, "munged", [str(MUNGED), "-F", "--force", f"--key-file={key}", f"--socket={socket_path}",
                                   f"--pid-file={root / 'munge' / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
                                   f"--seed-file={root / 'munge' / 'seed'}"])
        _wait_for_socket(socket_path, cluster)
        _start(cluster, "slurmctld", [str(SLURMCTLD), "-D", "-i", "-f", str(conf)])
        _start(cluster, "slurmd", [str(SLURMD), "-D", "-f", str(conf), "-N", NODE])
        _wait_up(cluster)
        yield cluster
    finally:
        if cluster.procs.get("slurmctld") and cluster.procs["slurmctld"].poll() is None:  # else squeue retries 20 s
            for job in subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split():
                subprocess.run(["scancel", job], capture_output=True)
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


def _wait_for_socket(path: Path, cluster: SlurmCluster, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            with socket.socket(socket.AF_UNIX) as s:
                if s.connect_ex(str(path)) == 0:
                    return
        if cluster.procs["munged"].poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"munged did not start: {(cluster.root / 'munged.out').read_text()}")


@pytest.fixture(scope="session")
def slurm_login(slurm_cluster, tmp_path_factory) -> Iterator[Path]:
    """The cluster's login node over ssh, as the alias `slurm-login` of the ssh config it returns."""
    if not Path("/usr/sbin/sshd").is_file() or not shutil.which("ssh"):
        pytest.skip("Debian's openssh-server is not installed here: ./scripts/install-test-deps installs it")
    root = tmp_path_factory.mktemp("slurm-login")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    user_key = root / "user_key"
    _keygen(user_key)
    authorized = root / "authorized_keys"
    shutil.copyfile(user_key.with_suffix(".pub"), authorized)
    server = start_sshd(root / "sshd", authorized, (f"SetEnv SLURM_CONF={slurm_cluster.conf} OMP_NUM_THREADS=1",))
    (root / "known_hosts").write_text(f"[127.0.0.1]:{server.port} {server.host_key}\n")
    config = root / "ssh_config"
    config.write_text("\n".join(["Host slurm-login", "  HostName 127.0.0.1", f"  Port {server.port}",
                                 f"  User {getpass.getuser()}", f"  IdentityFile {user_key}", "  IdentitiesOnly yes",
                                 f"  UserKnownHostsFile {root / 'known_hosts'}", "  GlobalKnownHostsFile /dev/null"])
                      + "\n")
    try:
        yield config
    finally:
        server.stop()


__all__ = ["slurm_cluster", "slurm_login", "SlurmCluster"]
