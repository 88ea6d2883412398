"""What the build uses: the compilers' memory (sampled from /proc), concurrent jobs, and the
cgroup's own counters (v1 and v2)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from .steps import kill_current

# Processes whose memory is the compile's memory. "comm" is cut at 15 characters.
COMPILERS = {
    "nvcc",
    "cicc",
    "ptxas",
    "cudafe++",
    "fatbinary",
    "nvlink",
    "cc1plus",
    "cc1",
    "as",
    "ld",
    "ld.bfd",
    "ld.gold",
    "collect2",
    "g++",
    "gcc",
    "c++",
    "cc",
    "x86_64-linux-gn",
    "aarch64-linux-g",  # the cross compilers (comm is cut at 15 characters)
    "clang",
    "clang++",
    "lto-wrapper",
    "lto1",
    "bin2c",
}
# ... and the versioned drivers ('g++-12': what the glibc sysroot's wrapper runs)
VERSIONED_COMPILER = re.compile(r"^(?:g\+\+|gcc|c\+\+|cc|clang\+\+|clang)-\d+$")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
EVENT_SAMPLE_SECONDS = 2.0  # a memory sample in the events file at least this often


def proc_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, comm, rss bytes) for every visible process."""
    table: dict[int, tuple[int, str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            with open(f"/proc/{entry}/statm", "rb") as fh:
                rss_pages = int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        lpar, rpar = stat.find("("), stat.rfind(")")
        comm = stat[lpar + 1 : rpar]
        fields = stat[rpar + 2 :].split()
        table[int(entry)] = (int(fields[1]), comm, rss_pages * PAGE)
    return table


def is_compiler(comm: str) -> bool:
    return comm in COMPILERS or VERSIONED_COMPILER.match(comm) is not None


def output_of(pid: int) -> str | None:
    """The ``-o`` argument of a compiler's command line (the object it builds), if readable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i, arg in enumerate(args[:-1]):
        if arg == "-o":
            return args[i + 1]
    return None


def descendants(table: dict[int, tuple[int, str, int]], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    stack = [r for r in roots if r in table]
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.add(pid)
        stack.extend(children.get(pid, ()))
    return out


class Sampler(threading.Thread):
    """Peak compiler RSS, concurrent compile jobs and the cgroup's anonymous memory. With an
    ``events`` file, one JSON line per compile job that starts or ends (by its ``-o``) and a
    memory sample every ``EVENT_SAMPLE_SECONDS``: what the host's progress and report read."""

    def __init__(self, roots: set[int], cgroup: CgroupReader | None, interval: float,
                 events: str | None = None) -> None:
        super().__init__(daemon=True)
        self._events = open(events, "a") if events else None  # noqa: SIM115
        self._live: dict[int, str] = {}  # job pid -> its output, as last announced
        self._last_sample = 0.0
        self.roots = roots
        self.cgroup = cgroup
        self.interval = interval
        self.peak_rss = 0
        self.peak_jobs = 0
        self.peak_anon: int | None = None
        # the cgroup's CPU time at the first and the last sample with a compiler running
        self._cpu_first: float | None = None
        self._cpu_last: float | None = None
        self.object_peaks: dict[str, int] = {}  # output path (-o) -> peak RSS of its job
        self._outputs: dict[int, str | None] = {}  # job pid -> its output path
        self.samples = 0
        self.oom_stopped = False
        self._oom_base: int | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def sample(self) -> None:
        table = proc_table()
        tree = descendants(table, set(self.roots))
        compilers = {p for p in tree if is_compiler(table[p][1])}
        rss = sum(table[p][2] for p in compilers)
        job_rss: dict[int, int] = {}
        for pid in compilers:
            # A job is a compiler with no compiler above it (nvcc -> sh -> cicc is one job).
            parent, top = table[pid][0], pid
            while parent in tree:
                if parent in compilers:
                    top = parent
                parent = table[parent][0]
            job_rss[top] = job_rss.get(top, 0) + table[pid][2]
        jobs = len(job_rss)
        for pid, size in job_rss.items():
            out = self._outputs.get(pid) or output_of(pid)  # None: not exec'd yet, ask again
            self._outputs[pid] = out
            if out:
                self.object_peaks[out] = max(size, self.object_peaks.get(out, 0))
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_jobs = max(self.peak_jobs, jobs)
        anon = None
        if self.cgroup is not None:
            if jobs:
                cpu = self.cgroup.cpu_seconds()
                if cpu is not None:
                    if self._cpu_first is None:
                        self._cpu_first = cpu
                    self._cpu_last = cpu
            anon = self.cgroup.anon()
            if anon is not None:
                self.peak_anon = max(self.peak_anon or 0, anon)
            self._stop_on_oom_kill()
        self.samples += 1
        if self._events is not None:
            self._emit_events(job_rss, rss, anon)

    @property
    def compile_cpu_seconds(self) -> float | None:
        """CPU seconds the build's cgroup used while compilers ran (from the first sample that
        saw one to the last): against the objects' wall seconds, how much of their time the
        compilers had a CPU (a builder shared with other work gives them less)."""
        if self._cpu_first is None or self._cpu_last is None:
            return None
        return round(self._cpu_last - self._cpu_first, 1)

    def _emit_events(self, job_rss: dict[int, int], rss: int, anon: int | None) -> None:
        assert self._events is not None
        now = time.time()
        lines: list[dict[str, Any]] = []
        for pid in [p for p in self._live if p not in job_rss]:
            ended = self._live.pop(pid)
            lines.append({"t": now, "end": ended, "peak": self.object_peaks.get(ended, 0)})
        for pid in job_rss:
            out = self._outputs.get(pid)
            if out and pid not in self._live:
                self._live[pid] = out
                lines.append({"t": now, "start": out})
        if now - self._last_sample >= EVENT_SAMPLE_SECONDS or lines:
            self._last_sample = now
            lines.append({"t": now, "rss": rss, "anon": anon, "jobs": len(job_rss)})
        self._events.write("".join(json.dumps(line) + "\n" for line in lines))
        self._events.flush()

    def _stop_on_oom_kill(self) -> None:
        """At the first OOM kill, stop the whole build: ninja would wait for the other jobs,
        and under a cap they had just outgrown they thrash for minutes instead of finishing
        (seen with five jobs under 3-4 GiB). The retry resumes with fewer jobs anyway."""
        assert self.cgroup is not None
        kills = self.cgroup.oom_kills()
        if kills is None:
            return
        if self._oom_base is None:
            self._oom_base = kills
        elif kills > self._oom_base and not self.oom_stopped:
            self.oom_stopped = True
            kill_current()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        self.sample()
        if self._events is not None:
            self._events.close()


# -- cgroup counters (v1 and v2) --------------------------------------------------------------
# The build's own view of its cgroup. The host's reads live in factory/planning/cgroup.py; this
# script cannot import them: it runs on the builder image's python, stdlib only, shipped as one zip.


def keyed(text: str | None, key: str) -> int | None:
    """The value of ``key`` in a cgroup 'key value' file (memory.stat, memory.events, ...)."""
    for ln in (text or "").splitlines():
        k, _, v = ln.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return None


class CgroupReader:
    """The memory cgroup this process is in. In a container the cgroup is mounted at the root of
    /sys/fs/cgroup even though /proc/self/cgroup names the host path, so both are tried."""

    def __init__(self) -> None:
        self.version = 0
        self.path: Path | None = None
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():
            rel = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), "/")
            for cand in (Path("/sys/fs/cgroup") / rel.lstrip("/"), Path("/sys/fs/cgroup")):
                if (cand / "memory.current").exists():
                    self.version, self.path = 2, cand
                    return
        for ln in lines:
            parts = ln.split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                base = Path("/sys/fs/cgroup/memory")
                for cand in (base / parts[2].lstrip("/"), base):
                    if (cand / "memory.usage_in_bytes").exists():
                        self.version, self.path = 1, cand
                        return

    def _read(self, name: str) -> str | None:
        if self.path is None:
            return None
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def _keyed(self, name: str, key: str) -> int | None:
        return keyed(self._read(name), key)

    def peak(self) -> int | None:
        text = self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def anon(self) -> int | None:
        if self.version == 2:
            return self._keyed("memory.stat", "anon")
        return self._keyed("memory.stat", "total_rss") or self._keyed("memory.stat", "rss")

    def oom_kills(self) -> int | None:
        if self.version == 2:
            return self._keyed("memory.events", "oom_kill")
        return self._keyed("memory.oom_control", "oom_kill")

    def limit(self) -> int | None:
        text = self._read("memory.max" if self.version == 2 else "memory.limit_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def cpu_seconds(self) -> float | None:
        """CPU time the cgroup's processes have used (v2 ``cpu.stat``; v1 ``cpuacct.usage``
        of the container's cpuacct hierarchy)."""
        if self.version == 2:
            usec = self._keyed("cpu.stat", "usage_usec")
            return usec / 1e6 if usec is not None else None
        for base in ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"):
            try:
                text = (Path(base) / "cpuacct.usage").read_text()
            except OSError:
                continue
            if text.strip().isdigit():
                return int(text) / 1e9
        return None

