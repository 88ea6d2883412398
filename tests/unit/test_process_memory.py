"""Per-job peak memory from the process tree (benchmarks/process_memory.py, measure_build.py's
sampler): jobs are ninja's children with their subtrees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from process_memory import PeakSampler, ProcInfo, read_processes, sample_tree  # noqa: E402

MB = 1024**2


def procs(*rows: tuple[int, int, str, int]) -> dict[int, ProcInfo]:
    return {pid: ProcInfo(pid=pid, ppid=ppid, name=name, rss_bytes=rss * MB)
            for pid, ppid, name, rss in rows}


def test_jobs_are_ninja_children_with_their_compilers() -> None:
    tree = procs(
        (10, 1, "pip", 100),
        (11, 10, "python3", 600),
        (12, 11, "ninja", 5),
        (13, 12, "sh", 1), (14, 13, "nvcc", 10), (15, 14, "cicc", 3000), (16, 14, "ptxas", 900),
        (17, 12, "sh", 1), (18, 17, "c++", 5), (19, 18, "cc1plus", 700),
        (99, 1, "unrelated", 5000),
    )
    s = sample_tree(10, tree)
    assert sorted(s.job_bytes) == [706 * MB, 3911 * MB]
    assert s.total_bytes == (100 + 600 + 5 + 3911 + 706) * MB


def test_no_ninja_means_no_jobs() -> None:
    s = sample_tree(10, procs((10, 1, "pip", 100), (11, 10, "python3", 50)))
    assert s.job_bytes == () and s.total_bytes == 150 * MB


def test_read_processes_sees_this_process() -> None:
    me = read_processes()
    import os

    assert os.getpid() in me and me[os.getpid()].rss_bytes > 0


def test_sampler_follows_a_real_tree() -> None:
    # The child says when it holds 64 MB and exits when stdin closes: no sleeps, no timing.
    code = ("import sys; b = b'x' * (64 * 1024 * 1024); print('ready', flush=True); "
            "sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sampler = PeakSampler(child.pid)
        sampler.sample_once()
        assert sampler.peak_total_bytes >= 64 * MB
        assert sampler.samples == 1
    finally:
        child.communicate("")
