"""Replay flash-attn's compile under memory caps and core counts: planner vs the alternatives.

Fed with the shipped ninja log (per-object seconds of the 2.8.3.post2 sm90 build, 16 jobs,
73 objects) and the per-job peak memory of the shipped memory history. For each cap and core
count it compares:

  planner      factory.planning.planner.plan_for's jobs x threads, objects longest-first (what
               factory.planning.critical_path makes ninja do)
  as built     the same jobs x threads in setuptools' order (sources sorted by name)
  LPT          longest-processing-time-first list schedule at the same jobs (the planner's
               order; equal by construction, reported to show it)
  bound        max(total work / cores, longest object): no schedule beats it
  upstream     flash-attn's own MAX_JOBS = min(cores / 2, free GB / 9), NVCC_THREADS=4,
               free GB read from the host (here: the host has exactly the cap free); OOM
               when its predicted peak exceeds the cap
  story        the fixed MAX_JOBS of the hand-built story (8 ... 128) with 4 archs x 4 threads

A job's time scales with arch rounds (ceil(archs / threads)); compilers beyond the cores
slow everything proportionally. Makespans are compile phases only (no link, no pip).

    python benchmarks/simulate_schedule.py [--log PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.units import GIB  # noqa: E402
from factory.matrix.cell import Cell  # noqa: E402
from factory.errors import PlanError  # noqa: E402
from factory.planning.memory_model import (  # noqa: E402
    MemoryHistory,
    ModelKey,
    ObjectTimes,
    read_ninja_log,
    shipped_history_path,
)
from factory.planning.planner import (  # noqa: E402
    jobs_that_fit,
    list_schedule,
    longest_first,
    plan_for,
    predicted_peak,
)

DATA = Path(__file__).resolve().parents[1] / "factory" / "data"
LOG = DATA / "flash-attn-2.8.3.post2_sm90_h200_16jobs.ninja_log"
CAPS_GIB = (16, 32, 64, 128, 256, 512)
CORES = (2, 4, 8, 16, 32, 64, 128)
STORY_JOBS = (8, 20, 32, 48, 64, 128)
UPSTREAM_THREADS = 4
CONTAINER_HOST_GIB = 1024  # the host a capped container runs on


def cell(archs: tuple[int, ...]) -> Cell:
    return Cell(package="flash-attn", version="2.8.3.post2", torch="2.11.0", cuda="13.0",
                archs=archs, python="3.12")


def makespan(seconds: dict[str, float], order: str, jobs: int, threads: int, archs: int,
             cores: int) -> float:
    base = ObjectTimes(package="flash-attn", version="", cuda="", archs=(90,), nvcc_threads=1,
                       seconds=seconds, source="")
    scaled = base.scaled(archs, threads)
    durations = (longest_first(scaled.values()) if order == "lpt"
                 else [scaled[k] for k in sorted(scaled)])
    slowdown = max(1.0, jobs * min(threads, archs) / cores)
    return list_schedule(durations, jobs) * slowdown


def _sizes(history: MemoryHistory, c: Cell, threads: int) -> dict[str, int]:
    est = history.estimate(ModelKey.for_cell(c, threads), model_key="flash-attn")
    return {"per_job": est.per_job_bytes, "largest": est.largest,
            "headroom": history.headroom_bytes("flash-attn")}


def peak(history: MemoryHistory, c: Cell, jobs: int, threads: int) -> int:
    """The planner's own peak model (the heaviest objects counted for the first jobs)."""
    return predicted_peak(jobs, **_sizes(history, c, threads))


def max_compilers(history: MemoryHistory, c: Cell, cap: int) -> int:
    """Most archs compiling at once that fit in ``cap``, over every thread count."""
    best = 0
    for threads in range(1, len(c.archs) + 1):
        jobs = jobs_that_fit(cap, **_sizes(history, c, threads))
        best = max(best, int(jobs) * min(threads, len(c.archs)))
    return best


def upstream_jobs(cap_gib: int, cores: int) -> int:
    # flash-attn 2.8.3 setup.py NinjaBuildExtension: psutil available memory / 9 GB, cores / 2.
    return max(1, min(max(1, cores // 2), int(cap_gib / 9)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    cap_gib: int
    cores: int
    bound: float  # max(work / cores, longest object)
    mem_bound: float  # the same with only as many compilers as fit in the cap
    plan: tuple[int, int] | None  # (jobs, threads); None: the planner refused
    peak: int = 0
    planner: float = 0.0
    as_built: float = 0.0
    lpt: float = 0.0
    upstream_jobs: int = 0
    upstream_oom: bool = False
    upstream_seconds: float = 0.0
    upstream_container_oom: bool = False
    story_oom: tuple[int, ...] = ()


def simulate(seconds: dict[str, float], history: MemoryHistory, archs: tuple[int, ...]
             ) -> list[Row]:
    c = cell(archs)
    a = len(archs)
    rows: list[Row] = []
    one_thread = ObjectTimes(package="", version="", cuda="", archs=(90,), nvcc_threads=1,
                             seconds=seconds, source="").scaled(a, 1)
    work = sum(one_thread.values())
    for cap in CAPS_GIB:
        limit = cap * GIB
        for cores in CORES:
            fastest_object = max(one_thread.values()) / min(a, cores)
            fit = max_compilers(history, c, limit)
            uj = upstream_jobs(cap, cores)
            # In a container the heuristic still reads the host's memory (psutil): a big host.
            cj = upstream_jobs(CONTAINER_HOST_GIB, cores)
            common: dict[str, Any] = {
                "cap_gib": cap, "cores": cores,
                "bound": max(work / cores, fastest_object),
                "mem_bound": max(work / max(1, min(cores, fit)), fastest_object),
                "upstream_jobs": uj,
                "upstream_oom": peak(history, c, uj, UPSTREAM_THREADS) > limit,
                "upstream_seconds": makespan(seconds, "alpha", uj, UPSTREAM_THREADS, a, cores),
                "upstream_container_oom": peak(history, c, cj, UPSTREAM_THREADS) > limit,
                "story_oom": tuple(n for n in STORY_JOBS
                                   if peak(history, c, n, UPSTREAM_THREADS) > limit),
            }
            try:
                plan = plan_for(c, supports_threads=True, memory_model_key="flash-attn",
                                memory=limit, cpus=cores, history=history)
            except PlanError:
                rows.append(Row(plan=None, **common))
                continue
            j, t = plan.max_jobs, plan.nvcc_threads
            rows.append(Row(
                plan=(j, t), peak=plan.predicted_peak_bytes,
                planner=makespan(seconds, "lpt", j, t, a, cores),
                as_built=makespan(seconds, "alpha", j, t, a, cores),
                lpt=makespan(seconds, "lpt", j, t, a, cores),
                **common,
            ))
    return rows


def table(rows: list[Row]) -> list[str]:
    out = [
        "| cap GiB | cores | plan jobs x threads | predicted peak GiB | planner s | as built s "
        "| planner vs as built | LPT s | bound s | bound in cap s | planner vs bound in cap "
        "| upstream jobs x threads: result |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        upstream = f"{r.upstream_jobs} x {UPSTREAM_THREADS}: " + (
            "OOM" if r.upstream_oom else f"{r.upstream_seconds:.0f} s")
        if r.plan is None:
            out.append(f"| {r.cap_gib} | {r.cores} | refused | - | - | - | - | - | "
                       f"{r.bound:.0f} | {r.mem_bound:.0f} | - | {upstream} |")
            continue
        j, t = r.plan
        out.append(
            f"| {r.cap_gib} | {r.cores} | {j} x {t} | {r.peak / GIB:.1f} | "
            f"{r.planner:.0f} | {r.as_built:.0f} | {100 * (r.planner / r.as_built - 1):+.1f} % | "
            f"{r.lpt:.0f} | {r.bound:.0f} | {r.mem_bound:.0f} | "
            f"{100 * (r.planner / r.mem_bound - 1):+.1f} % | {upstream} |"
        )
    return out


def summary(rows: list[Row]) -> list[str]:
    planned = [r for r in rows if r.plan is not None]
    n = len(rows)
    gains = sorted(1 - r.planner / r.as_built for r in planned)
    worst_lpt = max(r.planner / r.lpt - 1 for r in planned)
    worst_bound = max(r.planner / r.mem_bound - 1 for r in planned)
    story_oom = {j: sum(1 for r in rows if j in r.story_oom) for j in STORY_JOBS}
    return [
        f"- planner vs LPT at the same jobs: worst {100 * worst_lpt:+.1f} %; vs as built: "
        f"{100 * gains[0]:.1f} % to {100 * gains[-1]:.1f} % shorter (median "
        f"{100 * gains[len(gains) // 2]:.1f} %); refused (one job does not fit): "
        f"{n - len(planned)} of {n}",
        f"- planner vs the bound within the cap: worst {100 * worst_bound:+.1f} %",
        f"- upstream heuristic (NVCC_THREADS=4) OOMs in {sum(r.upstream_oom for r in rows)} of "
        f"{n} (cap, cores) pairs on a bare host whose free memory is the cap, and in "
        f"{sum(r.upstream_container_oom for r in rows)} of {n} in a container with that cap on "
        f"a {CONTAINER_HOST_GIB} GiB host; the planner in none (its predicted peak is within "
        "the cap by construction)",
        "- the story's fixed MAX_JOBS with NVCC_THREADS=4 OOM in: "
        + ", ".join(f"{j}: {k}/{n}" for j, k in story_oom.items()),
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=LOG, help="a .ninja_log of a 1-arch build")
    args = ap.parse_args(argv)
    seconds = read_ninja_log(args.log)
    history = MemoryHistory.load(shipped_history_path())  # read only: plan_for never writes

    alpha = [seconds[k] for k in sorted(seconds)]
    ref = {
        "as built": list_schedule(alpha, 16),
        "LPT": list_schedule(longest_first(seconds.values()), 16),
        "bound": max(sum(seconds.values()) / 16, max(seconds.values())),
    }
    print(f"{len(seconds)} objects, {sum(seconds.values()):.0f} s of compiling, longest "
          f"{max(seconds.values()):.0f} s ({args.log.name})")
    print("16 jobs, no memory cap: " + ", ".join(f"{k} {v:.0f} s" for k, v in ref.items())
          + f"; LPT is {100 * (1 - ref['LPT'] / ref['as built']):.1f} % under as built, "
          f"{100 * (ref['LPT'] / ref['bound'] - 1):.1f} % over the bound")
    for archs, title in (((90,), "one arch (the shipped sm90 log)"),
                         ((80, 90, 100, 120),
                          "four archs (flash-attn's default FLASH_ATTN_CUDA_ARCHS)")):
        rows = simulate(seconds, history, archs)
        print(f"\n### {title}\n")
        print("\n".join(table(rows)))
        print()
        print("\n".join(summary(rows)))
    story(history)
    return 0


STORY = ((288, 8, "slow, built"), (288, 128, "OOM"), (288, 64, "OOM"), (288, 32, "OOM"),
         (432, 48, "OOM"), (432, 32, "OOM"), (432, 20, "built in 9 min 46 s"))


def story(history: MemoryHistory) -> None:
    """The hand-built story replayed: 128 cores, 4 archs by default, NVCC_THREADS=4."""
    c = cell((80, 90, 100, 120))
    print()
    print("### The story (the hand-built attempts that motivated the factory): 128 cores, flash-attn's 4 default archs, "
          "NVCC_THREADS=4")
    print()
    print("| RAM GB | MAX_JOBS | model's predicted peak GB | model says | what happened |")
    print("|---:|---:|---:|---|---|")
    for ram, jobs, happened in STORY:
        p = peak(history, c, jobs, UPSTREAM_THREADS)
        print(f"| {ram} | {jobs} | {p / 1e9:.0f} | {'OOM' if p > ram * 1e9 else 'fits'} "
              f"| {happened} |")
    print()
    for ram in (288, 432):
        for archs, what in (((80, 90, 100, 120), "4 default archs"), ((100,), "sm_100 only")):
            plan = plan_for(cell(archs), supports_threads=True, memory_model_key="flash-attn",
                            memory=int(ram * 1e9), cpus=128, history=history)
            print(f"- planner at {ram} GB, 128 cores, {what}: MAX_JOBS={plan.max_jobs} "
                  f"NVCC_THREADS={plan.nvcc_threads}, predicted peak "
                  f"{plan.predicted_peak_bytes / 1e9:.0f} GB, compile "
                  f"{(plan.predicted_seconds or 0) / 60:.0f} min (H200-host object times)")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
