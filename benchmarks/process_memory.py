"""Peak memory of a build's compile jobs, measured from the process tree (for measure_build.py).

The memory model needs the PEAK per job, not the cgroup's peak: a cgroup counts page cache
(installing 2.9 GB of wheels fills it up to the limit, FIELD-NOTES s.8) and cannot tell one
job from another. A job here is one child of ninja (the nvcc driver, or g++) with everything
it spawns (cicc, ptxas, cudafe++, cc1plus); its memory is the sum of their RSS, sampled
periodically from /proc. Sampling can miss a short spike, so callers should treat the result
as a lower bound and the model keeps the maximum of several builds.

torch >= 2.14 prefixes ccache/sccache to the compilers when one is on PATH; with sccache the
compilers run under its server, not under ninja, and this tree sees only thin clients. Build
with TORCH_NO_COMPILER_WRAPPER=1 when measuring (and never record object times from a build
that hit a compiler cache: they are not compile times).

Builds run by the factory are sampled by its own sampler (factory/runners/inside/sampling.py), which
reports the compilers' summed RSS and the concurrent jobs; this one reports the largest single
job, which is what a hand measurement records into the memory model.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcInfo:
    pid: int
    ppid: int
    name: str
    rss_bytes: int


def read_processes(proc: Path = Path("/proc")) -> dict[int, ProcInfo]:
    """Every readable process: pid -> (ppid, name, RSS). Races with exiting processes are
    expected and skipped."""
    out: dict[int, ProcInfo] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            statm = (entry / "statm").read_text().split()
        except OSError:
            continue
        # The name is in parentheses and may itself contain ') '; split at the last one.
        head, _, rest = stat.rpartition(")")
        name = head.partition("(")[2]
        fields = rest.split()
        if len(fields) < 2 or len(statm) < 2:
            continue
        out[int(entry.name)] = ProcInfo(
            pid=int(entry.name), ppid=int(fields[1]), name=name, rss_bytes=int(statm[1]) * _PAGE
        )
    return out


def _children(procs: Mapping[int, ProcInfo]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    return kids


def subtree_rss(pid: int, procs: Mapping[int, ProcInfo], kids: Mapping[int, list[int]]) -> int:
    total, stack = 0, [pid]
    while stack:
        cur = stack.pop()
        if cur in procs:
            total += procs[cur].rss_bytes
        stack.extend(kids.get(cur, ()))
    return total


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeSample:
    total_bytes: int  # the whole tree under the root (pip, setup.py, ninja, compilers)
    job_bytes: tuple[int, ...]  # one entry per running compile job (child of a ninja)


def sample_tree(root_pid: int, procs: Mapping[int, ProcInfo] | None = None) -> TreeSample:
    procs = read_processes() if procs is None else procs
    kids = _children(procs)
    jobs: list[int] = []
    stack = [root_pid]
    while stack:
        cur = stack.pop()
        parent = procs.get(cur)
        for child in kids.get(cur, ()):
            if parent is not None and parent.name == "ninja":
                jobs.append(subtree_rss(child, procs, kids))
            else:
                stack.append(child)
    return TreeSample(total_bytes=subtree_rss(root_pid, procs, kids), job_bytes=tuple(jobs))


class PeakSampler:
    """Samples a process tree in a background thread until stopped; a context manager.

    ``peak_job_bytes`` is the largest single job seen (what the memory model records);
    ``peak_total_bytes`` the largest whole tree; ``peak_jobs`` the most jobs at once.
    """

    def __init__(self, root_pid: int, *, interval: float = 0.5, proc: Path = Path("/proc")) -> None:
        self.root_pid = root_pid
        self.interval = interval
        self.proc = proc
        self.peak_job_bytes = 0
        self.peak_total_bytes = 0
        self.peak_jobs = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peak-sampler", daemon=True)

    def sample_once(self) -> None:
        s = sample_tree(self.root_pid, read_processes(self.proc))
        self.samples += 1
        self.peak_total_bytes = max(self.peak_total_bytes, s.total_bytes)
        self.peak_jobs = max(self.peak_jobs, len(s.job_bytes))
        if s.job_bytes:
            self.peak_job_bytes = max(self.peak_job_bytes, max(s.job_bytes))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
