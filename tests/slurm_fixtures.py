"""A real single-node Slurm for the tests: Debian's munged, slurmctld and slurmd (installed by
docker/setup-host.sh), started on loopback with a slurm.conf written here (one node: this
machine, its real CPUs and memory), stopped and cleaned up after.

The plugins: proctrack/cgroup and task/cgroup with ConstrainRAMSpace, ConstrainSwapSpace and
ConstrainCores, the way GPU clusters run it: a job's memory is a cgroup limit (what the
factory's planner reads inside the job) and its CPUs a cpuset (the CPUs it sees). The cgroup
version is the host's: cgroup/v1 where the memory controller is mounted as v1 (this builder: a
container with the v1 hierarchy), else cgroup/v2. Everything (state, spool, logs, the munge
socket and key) lives in the fixture's directory; the node has a name of its own, so its job
cgroups (``slurm_<node>/...``) never meet another cluster's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cgroup_plugin() -> str:
    with open("/proc/self/mounts") as f:
        v1_memory = any(p[2] == "cgroup" and "memory" in p[3].split(",")
                        for p in (ln.split() for ln in f) if len(p) > 3)
    return "cgroup/v1" if v1_memory else "cgroup/v2"


def _node_figures(slurmd: str) -> tuple[int, int]:
    """(CPUs, RealMemory MB) as slurmd itself reads this machine."""
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=60).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return int(fields["CPUs"]), int(fields["RealMemory"])


@dataclasses.dataclass(frozen=True)
class Slurm:
    root: Path
    node: str
    env: dict[str, str]  # SLURM_CONF for the clients

    def run(self, *args: str, check: bool = True) -> str:
        tool = _which(args[0])
        assert tool, args[0]
        proc = subprocess.run([tool, *args[1:]], env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{args}: {proc.stdout}{proc.stderr}")
        return proc.stdout

    def queue(self) -> dict[str, str]:
        """job id -> state of every job in the queue."""
        out = self.run("squeue", "--noheader", "--format=%i %T")
        return dict(ln.split() for ln in out.splitlines() if ln.strip())

    def check_launches(self) -> None:
        """Fail at once (with slurmd's last words) when a job could not be started."""
        reasons = self.run("squeue", "--noheader", "--format=%i %r")
        if "launch failed" in reasons.lower():
            log = (self.root / "log" / "slurmd.log").read_text()[-3000:]
            raise AssertionError(f"a job could not be launched: {reasons}\n{log}")

    def job(self, job_id: str) -> dict[str, str]:
        """scontrol's fields of one job (also shortly after it ended)."""
        out = self.run("scontrol", "show", "job", "--oneliner", job_id)
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def wait_empty(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.queue():
            self.check_launches()
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs still queued after {timeout:.0f}s: {self.queue()}")
            time.sleep(5)


def _stop(pid_file: Path, sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().strip())
        os.kill(pid, sig)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def _remove_job_cgroups(node: str) -> None:
    """slurmd leaves its (empty) ``slurm_<node>`` hierarchies behind; remove ours only."""
    for d in Path("/sys/fs/cgroup").glob(f"*/slurm_{node}"):
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        Path(f"/sys/fs/cgroup/slurm_{node}").rmdir()


@contextlib.contextmanager
def slurm_cluster() -> Iterator[Slurm]:
    """The cluster's files go to a short directory of their own: slurmd's and munged's unix
    sockets live there, and a socket path may not exceed 108 bytes (a pytest tmp_path does)."""
    missing = [d for d in DAEMONS if not _which(d)]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)}): docker/setup-host.sh "
                    "installs slurmctld, slurmd, slurm-client and munge")
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs its daemons as root")
    slurmd = _which("slurmd")
    assert slurmd
    cpus, memory_mb = _node_figures(slurmd)
    node = f"fnode{os.getpid()}"
    root = Path(tempfile.mkdtemp(prefix="fslurm-", dir="/tmp"))
    for sub in ("munge", "state", f"spool/{node}", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = root / "munge" / "munge.sock"
    conf = root / "slurm.conf"
    node_line = (f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={cpus} "
                 f"RealMemory={memory_mb} Features=x86_64 State=UNKNOWN")
    conf.write_text(f"""\
ClusterName=factory{os.getpid()}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool' / '%n'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={root / 'log' / 'slurmd.log'}
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
KillWait=30
{node_line}
PartitionName=build Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
    (root / "cgroup.conf").write_text(f"""\
CgroupPlugin={_cgroup_plugin()}
ConstrainRAMSpace=yes
ConstrainSwapSpace=yes
AllowedSwapSpace=0
ConstrainCores=yes
""")
    env = {"SLURM_CONF": str(conf)}
    started: list[Path] = []
    try:
        munged = _which("munged")
        assert munged
        subprocess.run([munged, "--force", f"--socket={sock}", f"--key-file={key}",
                        f"--pid-file={root / 'munge' / 'munged.pid'}",
                        f"--log-file={root / 'munge' / 'munged.log'}",
                        f"--seed-file={root / 'munge' / 'seed'}"], check=True, timeout=60)
        started.append(root / "munge" / "munged.pid")
        ctld = _which("slurmctld")
        assert ctld
        subprocess.run([ctld, "-f", str(conf)], check=True, env={**os.environ, **env},
                       timeout=60)
        started.append(root / "slurmctld.pid")
        subprocess.run([slurmd, "-f", str(conf), "-N", node], check=True,
                       env={**os.environ, **env}, timeout=60)
        started.append(root / "slurmd.pid")
        cluster = Slurm(root=root, node=node, env=env)
        deadline = time.monotonic() + 60
        while "idle" not in cluster.run("sinfo", "--noheader", "--format=%T", check=False):
            if time.monotonic() > deadline:
                logs = (root / "log" / "slurmd.log").read_text()[-2000:]
                raise AssertionError(f"the test node never became idle:\n{logs}")
            time.sleep(1)
        yield cluster
    finally:
        if started:
            with contextlib.suppress(Exception):
                subprocess.run([_which("scancel") or "scancel", "--full", "--user=root"],
                               env={**os.environ, **env}, timeout=30)
        for pid_file in reversed(started):
            _stop(pid_file)
        _remove_job_cgroups(node)
        shutil.rmtree(root, ignore_errors=True)
