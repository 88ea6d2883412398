"""Replay flash-attn's compile under memory caps and core counts: planner vs the alternatives.

Fed with a real run's ninja log (default: the 16-job longest-first sm_90 run of 2026-11-29,
73 objects: its seconds are what each object really took) and the shipped memory history
(per-object peaks and times). For each cap and core count it compares:

  planner      factory.planning.planner.plan_for's jobs x threads, objects in the order the
               factory really writes into build.ninja (critical_path.reorder_build_ninja on a
               build.ninja in setuptools' order, priorities from the shipped history's times,
               which come from ANOTHER run: the FIELD-NOTES baseline)
  as built     the same jobs x threads in setuptools' order (sources sorted by name)
  LPT          the same jobs, longest first by the replayed run's own seconds (an oracle)
  bound        max(total work / cores, longest object): no schedule beats it
  really fit   the most jobs whose replayed peak (per-object peaks, start order) plus the
               measured non-compile memory fits the cap (the per-object figures reproduce
               every real run within 7 %: benchmarks/replay_real_runs.py); the planner's
               share of them, and OOMs (a plan whose replayed peak exceeds the cap)
  upstream     flash-attn's own MAX_JOBS = min(cores / 2, free GB / 9), NVCC_THREADS=4,
               free GB read from the host (here: the host has exactly the cap free); OOM
               when its predicted peak exceeds the cap
  story        the fixed MAX_JOBS of the hand-built story (8 ... 128) with 4 archs x 4 threads

A job's time scales with arch rounds (ceil(archs / threads)) and with contention
(factory.planning.replay.contention_factor: +14 % when every CPU compiles, proportionally past
the cores; the log's own 16 jobs on 16 CPUs are divided out). Makespans are compile phases only
(no link, no pip). Every memory figure is in GiB.

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
from factory.planning.critical_path import reorder_build_ninja  # noqa: E402
from factory.planning.planner import (  # noqa: E402
    jobs_that_fit,
    list_schedule,
    plan_for,
    predicted_peak,
)
from factory.planning.replay import contention_factor, replay  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "benchmarks" / "gpu" / "results-2026-11-29" / "sm90_16jobs_longest_first.ninja_log"
LOG_JOBS = LOG_CPUS = 16  # the conditions the log's seconds were measured under
CAPS_GIB = (16, 32, 64, 128, 256, 512)
CORES = (2, 4, 8, 16, 32, 64, 128)
STORY_JOBS = (8, 20, 32, 48, 64, 128)
UPSTREAM_THREADS = 4
CONTAINER_HOST_GIB = 1024  # the host a capped container runs on


def cell(archs: tuple[int, ...]) -> Cell:
    return Cell(package="flash-attn", version="2.8.3.post2", torch="2.11.0", cuda="13.0",
                archs=archs, python="3.12")


def ninja_order(keys: list[str], priorities: dict[str, float]) -> list[str]:
    """The order the factory writes into build.ninja: setuptools' sorted sources, rewritten by
    the very function the build's setup.py hook runs."""
    text = "\n".join(f"build {k}.o: cuda_compile {k}.cu" for k in sorted(keys))
    return [line.split(" ", 2)[1][:-3] for line in reorder_build_ninja(text, priorities)
            .splitlines()]


def orders(seconds: dict[str, float], priorities: dict[str, float]) -> dict[str, list[str]]:
    return {
        "ninja": ninja_order(list(seconds), priorities),
        "alpha": sorted(seconds),
        "lpt": sorted(seconds, key=lambda k: -seconds[k]),
    }


def durations(seconds: dict[str, float], order: list[str], jobs: int, threads: int,
              archs: int, cores: int) -> list[float]:
    base = ObjectTimes(package="flash-attn", version="", cuda="", archs=(90,), nvcc_threads=1,
                       seconds=seconds, source="")
    scaled = base.scaled(archs, threads)
    slowdown = (contention_factor(jobs * min(threads, archs), cores)
                / contention_factor(LOG_JOBS, LOG_CPUS))
    return [scaled[k] * slowdown for k in order]


def makespan(seconds: dict[str, float], order: list[str], jobs: int, threads: int, archs: int,
             cores: int) -> float:
    return list_schedule(durations(seconds, order, jobs, threads, archs, cores), jobs)


def replayed_peak(seconds: dict[str, float], peaks: dict[str, int], order: list[str],
                  jobs: int, cores: int) -> int:
    """One arch, one thread: the compile's peak with the per-object figures."""
    d = durations(seconds, order, jobs, 1, 1, cores)
    heaviest = max(peaks.values())
    objects = [(t, peaks.get(k, heaviest)) for t, k in zip(d, order, strict=True)]
    return replay(objects, jobs).peak_bytes


def really_fit(seconds: dict[str, float], peaks: dict[str, int], order: list[str], cap: int,
               cores: int, beside: int) -> int:
    for jobs in range(min(cores, len(seconds)), 0, -1):
        if replayed_peak(seconds, peaks, order, jobs, cores) + beside <= cap:
            return jobs
    return 0


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
    fit: int | None = None  # jobs that really fit (one arch only), None: not replayed
    oom: bool = False  # the plan's replayed peak exceeds the cap
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
    times = history.object_times(c)
    assert times is not None
    order = orders(seconds, dict(times.seconds))
    peaks = dict(times.peaks) if a == 1 else {}
    beside = history.non_compile_bytes("flash-attn")
    one_thread = ObjectTimes(package="", version="", cuda="", archs=(90,), nvcc_threads=1,
                             seconds=seconds, source="").scaled(a, 1)
    alone = contention_factor(LOG_JOBS, LOG_CPUS)
    work = sum(one_thread.values()) / alone
    for cap in CAPS_GIB:
        limit = cap * GIB
        for cores in CORES:
            fastest_object = max(one_thread.values()) / alone / min(a, cores)
            fit_jobs = really_fit(seconds, peaks, order["ninja"], limit, cores, beside) \
                if peaks else None
            fit = fit_jobs or max_compilers(history, c, limit)
            uj = upstream_jobs(cap, cores)
            # In a container the heuristic still reads the host's memory (psutil): a big host.
            cj = upstream_jobs(CONTAINER_HOST_GIB, cores)
            common: dict[str, Any] = {
                "cap_gib": cap, "cores": cores,
                "bound": max(work / cores, fastest_object),
                "mem_bound": max(work / max(1, min(cores, fit)), fastest_object),
                "upstream_jobs": uj,
                "upstream_oom": peak(history, c, uj, UPSTREAM_THREADS) > limit,
                "upstream_seconds": makespan(seconds, order["alpha"], uj, UPSTREAM_THREADS, a,
                                             cores),
                "upstream_container_oom": peak(history, c, cj, UPSTREAM_THREADS) > limit,
                "story_oom": tuple(n for n in STORY_JOBS
                                   if peak(history, c, n, UPSTREAM_THREADS) > limit),
                "fit": fit_jobs,
            }
            try:
                plan = plan_for(c, supports_threads=True, memory_model_key="flash-attn",
                                memory=limit, cpus=cores, history=history)
            except PlanError:
                rows.append(Row(plan=None, **common))
                continue
            j, t = plan.max_jobs, plan.nvcc_threads
            oom = bool(peaks) and (
                replayed_peak(seconds, peaks, order["ninja"], j, cores) + beside > limit)
            rows.append(Row(
                plan=(j, t), peak=plan.predicted_peak_bytes, oom=oom,
                planner=makespan(seconds, order["ninja"], j, t, a, cores),
                as_built=makespan(seconds, order["alpha"], j, t, a, cores),
                lpt=makespan(seconds, order["lpt"], j, t, a, cores),
                **common,
            ))
    return rows


def table(rows: list[Row]) -> list[str]:
    fits = any(r.fit is not None for r in rows)
    out = [
        "| cap GiB | cores | plan jobs x threads | predicted peak GiB | planner s | as built s "
        "| planner vs as built | LPT s | planner vs LPT | bound s | bound in cap s "
        "| planner vs bound in cap |" + (" really fit jobs |" if fits else "")
        + " upstream jobs x threads: result |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|" if fits else "") + "---|",
    ]
    for r in rows:
        upstream = f"{r.upstream_jobs} x {UPSTREAM_THREADS}: " + (
            "OOM" if r.upstream_oom else f"{r.upstream_seconds:.0f} s")
        fit = f" {r.fit} |" if fits else ""
        if r.plan is None:
            out.append(f"| {r.cap_gib} | {r.cores} | refused | - | - | - | - | - | - | "
                       f"{r.bound:.0f} | {r.mem_bound:.0f} | - |{fit} {upstream} |")
            continue
        j, t = r.plan
        out.append(
            f"| {r.cap_gib} | {r.cores} | {j} x {t}{' OOM' if r.oom else ''} | "
            f"{r.peak / GIB:.1f} | {r.planner:.0f} | {r.as_built:.0f} | "
            f"{100 * (r.planner / r.as_built - 1):+.1f} % | {r.lpt:.0f} | "
            f"{100 * (r.planner / r.lpt - 1):+.1f} % | {r.bound:.0f} | {r.mem_bound:.0f} | "
            f"{100 * (r.planner / r.mem_bound - 1):+.1f} % |{fit} {upstream} |"
        )
    return out


def summary(rows: list[Row]) -> list[str]:
    planned = [r for r in rows if r.plan is not None]
    n = len(rows)
    gains = sorted(1 - r.planner / r.as_built for r in planned)
    worst_lpt = max(r.planner / r.lpt - 1 for r in planned)
    worst_bound = max(r.planner / r.mem_bound - 1 for r in planned)
    story_oom = {j: sum(1 for r in rows if j in r.story_oom) for j in STORY_JOBS}
    out = [
        f"- planner (build.ninja order from the history) vs LPT by the replayed run's own "
        f"seconds, same jobs: worst {100 * worst_lpt:+.1f} %; vs as built: "
        f"{100 * gains[0]:.1f} % to {100 * gains[-1]:.1f} % shorter (median "
        f"{100 * gains[len(gains) // 2]:.1f} %); refused (one job does not fit): "
        f"{n - len(planned)} of {n}",
        f"- planner vs the bound within the cap: worst {100 * worst_bound:+.1f} %",
    ]
    judged = [r for r in rows if r.fit]
    if judged:
        share = sorted((r.plan[0] if r.plan else 0) / r.fit for r in judged if r.fit)
        out.append(
            f"- jobs that really fit (replayed peak + non-compile memory within the cap): the "
            f"planner "
            f"plans {100 * share[0]:.0f} % of them at worst, median "
            f"{100 * share[len(share) // 2]:.0f} %, >= 95 % in "
            f"{sum(1 for x in share if x >= 0.95)} of {len(share)}; OOM (plan's replayed peak "
            f"above the cap): {sum(r.oom for r in rows)} of {n}")
    out += [
        f"- upstream heuristic (NVCC_THREADS=4) OOMs in {sum(r.upstream_oom for r in rows)} of "
        f"{n} (cap, cores) pairs on a bare host whose free memory is the cap, and in "
        f"{sum(r.upstream_container_oom for r in rows)} of {n} in a container with that cap on "
        f"a {CONTAINER_HOST_GIB} GiB host",
        "- the story's fixed MAX_JOBS with NVCC_THREADS=4 OOM in: "
        + ", ".join(f"{j}: {k}/{n}" for j, k in story_oom.items()),
    ]
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=LOG,
                    help="a .ninja_log of a 1-arch build at 16 jobs on 16 CPUs")
    args = ap.parse_args(argv)
    seconds = read_ninja_log(args.log)
    history = MemoryHistory.load(shipped_history_path())  # read only: plan_for never writes
    times = history.object_times(cell((90,)))
    assert times is not None
    order = orders(seconds, dict(times.seconds))
    ref = {
        "as built": list_schedule([seconds[k] for k in order["alpha"]], 16),
        "build.ninja order": list_schedule([seconds[k] for k in order["ninja"]], 16),
        "LPT": list_schedule([seconds[k] for k in order["lpt"]], 16),
        "bound": max(sum(seconds.values()) / 16, max(seconds.values())),
    }
    print(f"{len(seconds)} objects, {sum(seconds.values()):.0f} s of compiling, longest "
          f"{max(seconds.values()):.0f} s ({args.log.name}); build.ninja order from "
          f"{times.source}")
    print("16 jobs, no memory cap: " + ", ".join(f"{k} {v:.0f} s" for k, v in ref.items())
          + f"; build.ninja order is {100 * (ref['build.ninja order'] / ref['LPT'] - 1):+.1f} %"
          f" vs LPT, {100 * (1 - ref['build.ninja order'] / ref['as built']):.1f} % under as "
          f"built, {100 * (ref['build.ninja order'] / ref['bound'] - 1):.1f} % over the bound")
    for archs, title in (((90,), "one arch (sm_90: per-object peaks replayed)"),
                         ((80, 90, 100, 120),
                          "four archs (flash-attn's default FLASH_ATTN_CUDA_ARCHS; no "
                          "per-object peaks: the per-job model)")):
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
    print("| RAM GiB | MAX_JOBS | model's predicted peak GiB | model says | what happened |")
    print("|---:|---:|---:|---|---|")
    for ram, jobs, happened in STORY:
        p = peak(history, c, jobs, UPSTREAM_THREADS)
        print(f"| {ram * 1e9 / GIB:.0f} | {jobs} | {p / GIB:.0f} | "
              f"{'OOM' if p > ram * 1e9 else 'fits'} | {happened} |")
    print()
    for ram in (288, 432):
        for archs, what in (((80, 90, 100, 120), "4 default archs"), ((100,), "sm_100 only")):
            plan = plan_for(cell(archs), supports_threads=True, memory_model_key="flash-attn",
                            memory=int(ram * 1e9), cpus=128, history=history)
            print(f"- planner at {ram * 1e9 / GIB:.0f} GiB, 128 cores, {what}: "
                  f"MAX_JOBS={plan.max_jobs} NVCC_THREADS={plan.nvcc_threads}, predicted peak "
                  f"{plan.predicted_peak_bytes / GIB:.0f} GiB, compile "
                  f"{(plan.predicted_seconds or 0) / 60:.0f} min (H200-host object times)")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
