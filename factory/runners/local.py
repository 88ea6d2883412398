"""The local runner: the same build as the docker runner, on this host, capped by a cgroup.

For GPU machines without docker (torch often installed already). The build runs the build script
under a fresh child cgroup: v2 ``memory.max`` + ``memory.swap.max=0`` + ``cpu.max`` + ``pids.max``;
v1 the memory (``memory.limit_in_bytes`` = ``memory.memsw.limit_in_bytes``), cpu and pids
controllers. OOM comes from the cgroup's ``oom_kill`` counter, peak from ``memory.peak`` /
``memory.max_usage_in_bytes``. Without a writable cgroup the runner refuses, unless it was
told to run uncapped: an uncapped flash-attn build is what took down the machines in the story.

No network isolation here: the build is offline by construction (``pip --no-index``), not by
the kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from factory.errors import EngineError
from factory.planning import cgroup
from factory.runners.base import (
    BuildJob,
    LineCallback,
    RunResult,
    prepare_run,
    read_report,
    result_from_report,
    write_inside_script,
)
from factory.runners.cache_config import inside_config
from factory.runners.docker import owner_alive, owner_token
from factory.runners.oom import was_oom_killed
from factory.toolchain.sysroot import sysroot_env

CGROUP_PREFIX = "factory-build-"
CGROUP_TIP = (
    "run as root on a host with cgroups (v1 or v2), use the docker runner, or pass --uncapped"
)
MODES = ("venv", "system-site", "existing")


class Cgroup:
    """One build's cgroup (one directory per v1 controller, one for v2)."""

    def __init__(self, version: int, dirs: dict[str, Path]) -> None:
        self.version = version
        self.dirs = dirs  # controller ('memory', 'cpu', 'pids'; 'unified' for v2) -> directory

    # -- making one ---------------------------------------------------------------------------
    @classmethod
    def create(cls, *, memory: int | None, cpus: float | None, pids: int | None) -> Cgroup:
        name = f"{CGROUP_PREFIX}{owner_token().replace(':', '-')}-{uuid.uuid4().hex[:6]}"
        mounts = cgroup.mounts()
        mine = cgroup.membership()
        v1 = {
            opt: Path(mp)
            for mp, fs, opts in mounts
            if fs == "cgroup"
            for opt in opts
            if opt in ("memory", "cpu", "pids")
        }
        unified = next((Path(mp) for mp, fs, _ in mounts if fs == "cgroup2"), None)
        if "memory" in v1:
            return cls._create_v1(name, v1, mine, memory=memory, cpus=cpus, pids=pids)
        if unified is not None and (unified / "cgroup.controllers").exists():
            return cls._create_v2(
                name, unified, mine.get("", "/"), memory=memory, cpus=cpus, pids=pids
            )
        raise EngineError(
            "no cgroup file system with a memory controller on this host", tip=CGROUP_TIP
        )

    @classmethod
    def _create_v1(
        cls,
        name: str,
        mounts: dict[str, Path],
        mine: dict[str, str],
        *,
        memory: int | None,
        cpus: float | None,
        pids: int | None,
    ) -> Cgroup:
        dirs: dict[str, Path] = {}
        try:
            for ctrl in ("memory", "cpu", "pids"):
                if (
                    ctrl not in mounts
                    or (ctrl == "cpu" and not cpus)
                    or (ctrl == "pids" and not pids)
                ):
                    continue
                parent = mounts[ctrl] / mine.get(ctrl, "/").lstrip("/")
                if not parent.is_dir():  # in a container the hierarchy root is ours
                    parent = mounts[ctrl]
                d = parent / name
                d.mkdir()
                dirs[ctrl] = d
            cg = cls(1, dirs)
            if memory:
                cg._write("memory", "memory.limit_in_bytes", str(memory))
                if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                    cg._write("memory", "memory.memsw.limit_in_bytes", str(memory))  # no swap
                with contextlib.suppress(OSError):
                    cg._write("memory", "memory.swappiness", "0")
            if cpus and "cpu" in dirs:
                cg._write("cpu", "cpu.cfs_period_us", "100000")
                cg._write("cpu", "cpu.cfs_quota_us", str(int(cpus * 100000)))
            if pids and "pids" in dirs:
                cg._write("pids", "pids.max", str(pids))
        except OSError as exc:
            for d in dirs.values():
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise EngineError(
                f"cannot set up a cgroup (v1) for the build: {exc.strerror or exc}", tip=CGROUP_TIP
            ) from None
        return cg

    @classmethod
    def _create_v2(
        cls,
        name: str,
        root: Path,
        mine: str,
        *,
        memory: int | None,
        cpus: float | None,
        pids: int | None,
    ) -> Cgroup:
        # v2 lets a cgroup hand controllers to children only when it holds no processes
        # itself, so builds get a sibling of ours ("factory-builds") rather than a child.
        here = root / mine.lstrip("/")
        candidates = [here.parent / "factory-builds", root / "factory-builds"]
        want = ["memory", "pids"] + (["cpu"] if cpus else [])
        last: OSError | None = None
        for parent in candidates:
            try:
                parent.mkdir(exist_ok=True)
                with contextlib.suppress(OSError):
                    (parent.parent / "cgroup.subtree_control").write_text(
                        " ".join(f"+{c}" for c in want)
                    )
                (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in want))
                d = parent / name
                d.mkdir()
                cg = cls(2, {"unified": d})
                if memory:
                    cg._write("unified", "memory.max", str(memory))
                    with contextlib.suppress(OSError):
                        cg._write("unified", "memory.swap.max", "0")
                if cpus:
                    cg._write("unified", "cpu.max", f"{int(cpus * 100000)} 100000")
                if pids:
                    cg._write("unified", "pids.max", str(pids))
                return cg
            except OSError as exc:
                last = exc
                with contextlib.suppress(OSError):
                    (parent / name).rmdir()
        reason = last.strerror if last and last.strerror else str(last)
        raise EngineError(f"cannot set up a cgroup (v2) for the build: {reason}", tip=CGROUP_TIP)

    # -- using one ----------------------------------------------------------------------------
    def _write(self, ctrl: str, file: str, value: str) -> None:
        (self.dirs[ctrl] / file).write_text(value)

    @property
    def memory_dir(self) -> Path | None:
        return self.dirs.get("unified" if self.version == 2 else "memory")

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def peak(self) -> int | None:
        return cgroup.memory_peak(self.memory_dir) if self.memory_dir else None

    def oom_kills(self) -> int | None:
        return cgroup.oom_kills(self.memory_dir) if self.memory_dir else None

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                out |= {int(p) for p in f.read_text().split()}
        return out

    def kill_all(self) -> None:
        """Nothing started by the build survives it (stray ptxas, sccache servers)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                self._write("unified", "cgroup.kill", "1")
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def cleanup_stale_cgroups() -> list[Path]:
    """Kill and remove build cgroups whose owner process is gone (a factory killed with -9)."""
    removed = []
    mine = cgroup.membership()
    for mp, fs, opts in cgroup.mounts():
        ctrls = [o for o in opts if o in ("memory", "cpu", "pids")] if fs == "cgroup" else [""]
        for ctrl in ctrls:
            base = Path(mp)
            rel = mine.get(ctrl, "/").lstrip("/")
            parents = {
                base,
                base / rel,
                (base / rel).parent / "factory-builds",
                base / "factory-builds",
            }
            for parent in parents:
                if not parent.is_dir():
                    continue
                for d in parent.glob(f"{CGROUP_PREFIX}*"):
                    token = d.name[len(CGROUP_PREFIX) :].rsplit("-", 1)[0]
                    host_pid_start = token.rsplit("-", 2)
                    if len(host_pid_start) == 3 and owner_alive(":".join(host_pid_start)):
                        continue
                    cg = Cgroup(2 if fs == "cgroup2" else 1, {ctrl or "unified": d})
                    cg.remove()
                    if not d.exists():
                        removed.append(d)
    return removed


class LocalRunner:
    """``mode``: 'venv' (fresh venv, install from the wheelhouse), 'system-site' (venv that sees
    the interpreter's packages, e.g. a system torch; only missing ones are installed), or
    'existing' (the interpreter as it is, nothing installed)."""

    name = "local"

    def __init__(
        self, *, uncapped: bool = False, interpreter: str | None = None, mode: str = "venv"
    ) -> None:
        if mode not in MODES:
            raise EngineError(f"unknown local runner mode {mode!r}; known: {', '.join(MODES)}")
        self.uncapped = uncapped
        self.interpreter = interpreter
        self.mode = mode
        self.needs_wheelhouse = mode == "venv"  # the others use the interpreter's packages

    def start(self) -> None:
        """Nothing: each run clears the cgroups of killed builds itself."""

    def prepare(self, job: BuildJob) -> None:
        """Nothing: the interpreter and the venv are the run's own steps."""

    def _python(self, job: BuildJob) -> str:
        if self.interpreter:
            return self.interpreter
        found = shutil.which(f"python{job.python}")
        if found:
            return found
        if f"{sys.version_info[0]}.{sys.version_info[1]}" == job.python:
            return sys.executable
        raise EngineError(
            f"no Python {job.python} interpreter on this host",
            tip="install it, or pass the interpreter to the local runner",
        )

    def inside_job(self, job: BuildJob, *, report: Path, capped: bool) -> dict[str, Any]:
        venv = None if self.mode == "existing" else str(job.venv_for(self.name).resolve())
        return {
            "cell_id": job.cell_id,
            "python": self._python(job),
            "venv": venv,
            "system_site_packages": self.mode == "system-site",
            "requirements": [] if self.mode == "existing" else list(job.requirements),
            "wheelhouse": str(job.wheelhouse.resolve()),
            "src": str(job.src_dir.resolve()),
            "out": str(job.out_dir.resolve()),
            "run_dir": str(report.parent),
            "log": str(job.log_path.resolve()),
            "report": str(report),
            "env": {**job.env, **sysroot_env(job.sysroot)},
            "cuda_home": str(job.cuda_home.resolve()) if job.cuda_home else None,
            "cross": (
                # without a venv of its own, the target's files go next to the build tree
                job.inside_cross(venv or str(job.src_dir.parent.resolve()),
                                 str(job.target_wheelhouse.resolve()))
                if job.target_wheelhouse else None
            ),
            "cache": (
                {
                    **inside_config(root=str(job.cache_dir.resolve()), size=job.cache_size,
                                    normalize_paths=False),
                    "port": str(4300 + os.getpid() % 2000),
                }
                if job.cache_dir
                else None
            ),
            # beside the cell's build tree: the same path every run (compile-cache keys)
            "compilers": job.inside_compilers(
                str(job.src_dir.parent.resolve() / "toolkit"),
                str(job.log_path.resolve()) + ".compilers.jsonl",
            ),
            "check_build_requires": job.check_build_requires,
            "watch_stdin": True,
            "read_cgroup": capped,
            "sample_interval": 0.5,
        }

    def describe(self, job: BuildJob) -> dict[str, Any]:
        return {
            "runner": self.name,
            "mode": self.mode,
            "uncapped": self.uncapped,
            "memory_limit_bytes": job.memory_limit_bytes,
            "cpus": job.cpus,
            "pids_limit": job.pids_limit,
            "inside_job": self.inside_job(job, report=Path("<report>"), capped=not self.uncapped),
        }

    def run(self, job: BuildJob, *, on_line: LineCallback | None = None) -> RunResult:
        cleanup_stale_cgroups()
        build_cgroup = None
        if not self.uncapped:
            build_cgroup = Cgroup.create(
                memory=job.memory_limit_bytes, cpus=job.cpus, pids=job.pids_limit
            )
        # Uncapped inside an allocation (a pod, a Slurm job that may not make cgroups): the
        # allocation's limit is the cap and its OOM counter the verdict.
        allocation = cgroup.limiting_memory_dir() if build_cgroup is None else None
        kills_before = cgroup.oom_kills(allocation) if allocation else None
        run_dir, report_path = prepare_run(job)
        started = time.monotonic()
        timed_out = False
        try:
            job_file = run_dir / "job.json"
            job_file.write_text(
                json.dumps(
                    self.inside_job(
                        job, report=report_path.resolve(), capped=build_cgroup is not None
                    ),
                    indent=2,
                )
            )
            argv = [sys.executable, str(write_inside_script(run_dir)), str(job_file)]
            if build_cgroup is not None:
                # The child joins the cgroup before exec, so nothing it starts escapes the cap.
                joins = " && ".join(
                    f"echo $$ > {shlex.quote(str(f))}" for f in build_cgroup.procs_files
                )
                argv = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *argv]
            # stdin is the lifeline: when this process dies (even by SIGKILL) the pipe closes
            # and the build script stops the build.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            reader = threading.Thread(target=_pump, args=(proc, on_line), daemon=True)
            reader.start()
            try:
                proc.wait(timeout=job.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:
                _stop(proc)
                raise
            if timed_out:
                _stop(proc)
            reader.join(timeout=10)
            exit_code = proc.returncode
            report = read_report(report_path)
            if build_cgroup is not None:
                oom_count = build_cgroup.oom_kills()
            elif allocation is not None and kills_before is not None:
                after = cgroup.oom_kills(allocation)
                oom_count = None if after is None else after - kills_before
            else:
                oom_count = None
            peak = build_cgroup.peak() if build_cgroup else None
        finally:
            if build_cgroup is not None:
                build_cgroup.remove()
            shutil.rmtree(run_dir, ignore_errors=True)
        return result_from_report(
            job=job,
            report=report,
            exit_code=exit_code,
            # Uncapped outside any allocation there is no counter: a compiler killed by the
            # kernel's global OOM killer shows as 137 only when it is the process we waited for.
            oom_killed=was_oom_killed(
                exit_code=exit_code, own_cgroup=build_cgroup is not None, oom_kills=oom_count
            ),
            oom_kill_count=oom_count,
            cgroup_peak_bytes=peak,
            wall_seconds=time.monotonic() - started,
            timed_out=timed_out,
            runner=self.name,
        )


def _pump(proc: subprocess.Popen[bytes], on_line: LineCallback | None) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        if on_line is not None:
            on_line(raw.decode(errors="replace").rstrip("\n"))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Close the lifeline first (the build script then stops its build), then make sure."""
    with contextlib.suppress(OSError):
        if proc.stdin:
            proc.stdin.close()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
