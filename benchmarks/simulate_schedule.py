"""Replay flash-attn's compile under memory caps and core counts: planner vs the alternatives.

Fed with a real run's ninja log (default: the 16-job longest-first sm_90 run of 2026-11-29,
73 objects: its seconds are what each object really took) and the shipped memory history
(per-object peaks and times). Everything below is the MODEL's replay of that log (durations
from it, memory from the model): what real builds did is benchmarks/replay_real_runs.py.
For each cap and core count it compares:

  planner      factory.planning.planner.plan_for's jobs x threads, objects in the order the
               factory really writes into build.ninja (critical_path.reorder_build_ninja on a
               build.ninja in setuptools' order, priorities from the shipped history's times,
               which come from ANOTHER run: the FIELD-NOTES baseline)
  as built     the same jobs x threads in setuptools' order (sources sorted by name)
  LPT          the same jobs, longest first by the replayed run's own seconds: a heuristic
               with oracle times, no ceiling
  best packing the shortest assignment of the objects to the same jobs found (LPT, then moves
               and swaps off the slot that ends last): a schedule that exists, not the optimum
  CPU bound    max(total work / cores, longest object): no schedule beats it
  memory bound (one arch) a lower bound for ANY schedule under the replay model's memory: an
               object holds its peak for its first PEAK_WINDOW s and TAIL_FRACTION of it after
               (factory.planning.replay), never runs faster than alone, and the compiles' memory
               never exceeds cap - non-compile memory; so the makespan is at least the sum of
               every object's memory x seconds at its fastest over what the cap holds. With it:
               a memory-aware dispatcher of the same model (starts the next objects that fit
               memory and a free core, at each start or drop): a schedule, so never below it
               (checked here on every row)
  model fit    (one arch) the most jobs whose replayed peak (per-object peaks, start order)
               plus the measured non-compile memory fits the cap: the planner's own model
               judging its own plan (real fits and OOMs: replay_real_runs.py)
  upstream     flash-attn's own MAX_JOBS = min(cores / 2, free GB / 9), NVCC_THREADS=4,
               free GB read from the host (here: the host has exactly the cap free); its "OOM"
               is the model's verdict (one arch: the replay; four archs: the per-job model)
  story        the fixed MAX_JOBS of the hand-built story (8 ... 128) with 4 archs x 4 threads,
               judged by the per-job model; against what really happened: ``story``

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

from factory.errors import PlanError  # noqa: E402
from factory.matrix.cell import Cell  # noqa: E402
from factory.planning.critical_path import reorder_build_ninja  # noqa: E402
from factory.planning.history_file import shipped_history_path  # noqa: E402
from factory.planning.memory_model import MemoryHistory, ModelKey  # noqa: E402
from factory.planning.ninja_log import read_ninja_log  # noqa: E402
from factory.planning.object_times import ObjectTimes  # noqa: E402
from factory.planning.planner import (  # noqa: E402
    jobs_that_fit,
    plan_for,
    predicted_peak,
)
from factory.planning.replay import (  # noqa: E402
    PEAK_WINDOW_SECONDS,
    TAIL_FRACTION,
    contention_factor,
    list_schedule,  # noqa: E402
    replay,
)
from factory.units import GIB  # noqa: E402

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


def best_packing(durations: list[float], slots: int, rounds: int = 2000) -> float:
    """The shortest packing of ``durations`` onto ``slots`` found: LPT, then moves and swaps
    of one object between the slot that ends last and another while that shortens it (every
    packing is a list schedule of some order, so ninja could run it)."""
    loads = [0.0] * max(1, slots)
    items: list[list[float]] = [[] for _ in loads]
    for d in sorted(durations, reverse=True):
        i = loads.index(min(loads))
        loads[i] += d
        items[i].append(d)
    for _ in range(rounds):
        last = loads.index(max(loads))
        best: tuple[float, int, int, int | None] | None = None  # (new max, i, j, k)
        for a, d in enumerate(items[last]):
            for j in range(len(loads)):
                if j == last:
                    continue
                options: list[tuple[int | None, float]] = [(None, 0.0)]
                options += list(enumerate(items[j]))
                for b, e in options:
                    if e >= d:
                        continue
                    new = max(loads[last] - d + e, loads[j] + d - e)
                    if new < loads[last] - 1e-9 and (best is None or new < best[0]):
                        best = (new, a, j, b)
        if best is None:
            break
        _, a, j, b = best
        d = items[last].pop(a)
        e = items[j].pop(b) if b is not None else 0.0
        items[j].append(d)
        if b is not None:
            items[last].append(e)
        loads[last] += e - d
        loads[j] += d - e
    return max(loads)


def _area(peak: int, seconds: float) -> float:
    """An object's memory x seconds under the replay model (byte-seconds)."""
    head = min(PEAK_WINDOW_SECONDS, seconds)
    return peak * (head + TAIL_FRACTION * max(0.0, seconds - PEAK_WINDOW_SECONDS))


def fastest(seconds: dict[str, float], cores: int) -> dict[str, float]:
    """Each object's seconds at its fastest under the model: alone on the cores."""
    factor = contention_factor(1, cores) / contention_factor(LOG_JOBS, LOG_CPUS)
    return {k: v * factor for k, v in seconds.items()}


def memory_bound(seconds: dict[str, float], peaks: dict[str, int], cap: int, cores: int,
                 beside: int) -> float:
    """A lower bound on any schedule's makespan under the replay model and the cap: the
    compiles hold at most cap - beside at any moment, and every object needs at least its
    memory x seconds at its fastest (more time at a lower rate only adds to it). inf when
    one object alone does not fit."""
    room = cap - beside
    heaviest = max(peaks.values())
    if room < heaviest:
        return float("inf")
    alone = fastest(seconds, cores)
    return sum(_area(peaks.get(k, heaviest), d) for k, d in alone.items()) / room


def memory_aware(seconds: dict[str, float], peaks: dict[str, int], order: list[str],
                 cap: int, cores: int, beside: int) -> float:
    """A dispatcher of the replay model that watches memory: whenever an object ends or
    leaves its front end, start the next objects in ``order`` (skipping those that do not
    fit) while a core is free and the compiles' memory stays within cap - beside. An object
    takes its fastest time x the contention of the compiles running once it starts."""
    room = cap - beside
    heaviest = max(peaks.values())
    alone = fastest(seconds, cores)
    waiting = list(order)
    running: list[tuple[float, float, int]] = []  # (start, end, peak)
    now = span = 0.0

    def level(t: float) -> float:
        return sum(p if t < s + PEAK_WINDOW_SECONDS else TAIL_FRACTION * p
                   for s, e, p in running if e > t)

    while waiting or running:
        running = [r for r in running if r[1] > now + 1e-9]
        for k in list(waiting):
            if len(running) >= cores:
                break
            peak = peaks.get(k, heaviest)
            if level(now) + peak <= room:
                n = len(running) + 1
                d = alone[k] * contention_factor(n, cores) / contention_factor(1, cores)
                running.append((now, now + d, peak))
                waiting.remove(k)
                span = max(span, now + d)
        if not running and waiting:
            return float("inf")  # an object that does not fit alone
        events = [e for _, e, _ in running] + [s + PEAK_WINDOW_SECONDS for s, e, _ in running
                                               if s + PEAK_WINDOW_SECONDS < e]
        later = [t for t in events if t > now + 1e-9]
        now = min(later) if later else now
        if not waiting and not later:
            break
    return span


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
    # one arch: the memory-time bound of the replay model; four archs: work / the compilers
    # the per-job model lets fit (a bound of that model: every job holds its figure throughout)
    mem_bound: float
    plan: tuple[int, int] | None  # (jobs, threads); None: the planner refused
    peak: int = 0
    planner: float = 0.0
    as_built: float = 0.0
    lpt: float = 0.0
    packed: float = 0.0  # best packing found on the plan's jobs
    dispatcher: float | None = None  # one arch: the memory-aware dispatcher of the model
    fit: int | None = None  # jobs the replay lets fit (one arch only), None: not replayed
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
    peaks = dict(times.peaks) if a == 1 else {}
    beside = history.non_compile_bytes("flash-attn")
    one_thread = ObjectTimes(package="", version="", cuda="", archs=(90,), nvcc_threads=1,
                             seconds=seconds, source="").scaled(a, 1)
    alone = contention_factor(LOG_JOBS, LOG_CPUS)
    work = sum(one_thread.values()) / alone
    for cap in CAPS_GIB:
        limit = cap * GIB
        for cores in CORES:
            # build.ninja's order as the factory writes it for a plan on these cores: by the
            # object times measured nearest them (MemoryHistory.object_times)
            near = history.object_times(c, cpus=cores) or times
            order = orders(seconds, dict(near.seconds))
            fastest_object = max(one_thread.values()) / alone / min(a, cores)
            fit_jobs = really_fit(seconds, peaks, order["ninja"], limit, cores, beside) \
                if peaks else None

            def ooms(jobs: int, order_name: str = "alpha", cores: int = cores,
                     limit: int = limit, order: dict[str, list[str]] = order) -> bool:
                """The model's verdict: the replay (one arch) or the per-job model."""
                if peaks:
                    return replayed_peak(seconds, peaks, order[order_name], jobs,
                                         cores) + beside > limit
                return peak(history, c, jobs, UPSTREAM_THREADS) > limit

            if peaks:
                mem_bound = max(memory_bound(seconds, peaks, limit, cores, beside),
                                work / cores, fastest_object)
                dispatcher = memory_aware(seconds, peaks, order["lpt"], limit, cores, beside)
                assert dispatcher >= mem_bound - 1e-6, (cap, cores, dispatcher, mem_bound)
            else:
                fit = max_compilers(history, c, limit)
                mem_bound = max(work / max(1, min(cores, fit)), fastest_object)
                dispatcher = None
            uj = upstream_jobs(cap, cores)
            # In a container the heuristic still reads the host's memory (psutil): a big host.
            cj = upstream_jobs(CONTAINER_HOST_GIB, cores)
            common: dict[str, Any] = {
                "cap_gib": cap, "cores": cores,
                "bound": max(work / cores, fastest_object),
                "mem_bound": mem_bound, "dispatcher": dispatcher,
                "upstream_jobs": uj,
                "upstream_oom": ooms(uj),
                "upstream_seconds": makespan(seconds, order["alpha"], uj, UPSTREAM_THREADS, a,
                                             cores),
                "upstream_container_oom": ooms(cj),
                "story_oom": tuple(n for n in STORY_JOBS if ooms(n)),
                "fit": fit_jobs,
            }
            try:
                plan = plan_for(c, supports_threads=True, memory_model_key="flash-attn",
                                memory=limit, cpus=cores, history=history)
            except PlanError:
                rows.append(Row(plan=None, **common))
                continue
            j, t = plan.max_jobs, plan.nvcc_threads
            oom = bool(peaks) and ooms(j, "ninja")
            rows.append(Row(
                plan=(j, t), peak=plan.predicted_peak_bytes, oom=oom,
                planner=makespan(seconds, order["ninja"], j, t, a, cores),
                as_built=makespan(seconds, order["alpha"], j, t, a, cores),
                lpt=makespan(seconds, order["lpt"], j, t, a, cores),
                packed=best_packing(durations(seconds, order["lpt"], j, t, a, cores), j),
                **common,
            ))
    return rows


def _pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.1f} %"


def table(rows: list[Row]) -> list[str]:
    one_arch = any(r.fit is not None for r in rows)
    mem = "memory bound s" if one_arch else "per-job model's bound s"
    head = ("| cap GiB | cores | plan jobs x threads | predicted peak GiB | planner s | as built s "
            "| planner vs as built | LPT heuristic s | best packing found s | planner vs best "
            f"packing | CPU bound s | {mem} | planner vs {mem[:-2]} |")
    cols = 13
    if one_arch:
        head += " memory-aware dispatcher s | model fit jobs |"
        cols += 2
    head += " upstream jobs x threads: model says |"
    out = [head, "|" + "---:|" * cols + "---|"]
    for r in rows:
        upstream = f"{r.upstream_jobs} x {UPSTREAM_THREADS}: " + (
            "OOM" if r.upstream_oom else f"{r.upstream_seconds:.0f} s")
        extra = f" {r.dispatcher:.0f} | {r.fit} |" if one_arch and r.dispatcher else (
            " - | - |" if one_arch else "")
        if r.plan is None:
            out.append(f"| {r.cap_gib} | {r.cores} | refused | - | - | - | - | - | - | - | "
                       f"{r.bound:.0f} | {r.mem_bound:.0f} | - |{extra} {upstream} |")
            continue
        j, t = r.plan
        out.append(
            f"| {r.cap_gib} | {r.cores} | {j} x {t}{' OOM' if r.oom else ''} | "
            f"{r.peak / GIB:.1f} | {r.planner:.0f} | {r.as_built:.0f} | "
            f"{_pct(r.planner, r.as_built)} | {r.lpt:.0f} | {r.packed:.0f} | "
            f"{_pct(r.planner, r.packed)} | {r.bound:.0f} | {r.mem_bound:.0f} | "
            f"{_pct(r.planner, r.mem_bound)} |{extra} {upstream} |"
        )
    return out


def summary(rows: list[Row]) -> list[str]:
    planned = [r for r in rows if r.plan is not None]
    n = len(rows)
    gains = sorted(1 - r.planner / r.as_built for r in planned)
    worst_lpt = max(r.planner / r.lpt - 1 for r in planned)
    worst_packed = max(r.planner / r.packed - 1 for r in planned)
    lpt_over_packed = max(r.lpt / r.packed - 1 for r in planned)
    worst_bound = max(r.planner / r.mem_bound - 1 for r in planned)
    story_oom = {j: sum(1 for r in rows if j in r.story_oom) for j in STORY_JOBS}
    one_arch = any(r.fit is not None for r in rows)
    judge = "the replay" if one_arch else "the per-job model"
    out = [
        f"- planner (build.ninja order from the history) vs the LPT heuristic by the replayed "
        f"run's own seconds, same jobs: worst {100 * worst_lpt:+.1f} %; vs the best packing "
        f"found on the same jobs: worst {100 * worst_packed:+.1f} % (LPT itself is up to "
        f"{100 * lpt_over_packed:.1f} % above it); vs as built: "
        f"{100 * gains[0]:.1f} % to {100 * gains[-1]:.1f} % shorter (median "
        f"{100 * gains[len(gains) // 2]:.1f} %); refused (one job does not fit): "
        f"{n - len(planned)} of {n}",
        (f"- planner vs the memory bound (a lower bound for any schedule under the replay "
         f"model and the cap): worst {100 * worst_bound:+.1f} %" if one_arch else
         f"- planner vs the per-job model's bound (work over the compilers that model lets fit: "
         f"a bound of that model only): worst {100 * worst_bound:+.1f} %"),
    ]
    if one_arch:
        disp = [r for r in planned if r.dispatcher]
        below = sum(1 for r in disp if r.dispatcher is not None and r.dispatcher < r.planner)
        out.append(
            f"- the memory-aware dispatcher of the same model beats the planner's fixed jobs in "
            f"{below} of {len(disp)} rows (best by "
            f"{100 * max(1 - (r.dispatcher or r.planner) / r.planner for r in disp):.1f} %); "
            "it never goes below the memory bound (checked on every row)")
    judged = [r for r in rows if r.fit]
    if judged:
        share = sorted((r.plan[0] if r.plan else 0) / r.fit for r in judged if r.fit)
        out.append(
            "- the model judging its own plan (NOT a measurement; real fits and OOMs: "
            "replay_real_runs.py): of the jobs whose replayed peak + non-compile memory fits "
            f"the cap, the planner plans {100 * share[0]:.0f} % at worst, median "
            f"{100 * share[len(share) // 2]:.0f} %, >= 95 % in "
            f"{sum(1 for x in share if x >= 0.95)} of {len(share)}; plans above the replayed "
            f"cap: {sum(r.oom for r in rows)} of {n}")
    out += [
        f"- upstream heuristic (NVCC_THREADS=4), OOM as {judge} says (not a measurement): "
        f"{sum(r.upstream_oom for r in rows)} of {n} (cap, cores) pairs on a bare host whose "
        f"free memory is the cap, {sum(r.upstream_container_oom for r in rows)} of {n} in a "
        f"container with that cap on a {CONTAINER_HOST_GIB} GiB host",
        f"- the story's fixed MAX_JOBS with NVCC_THREADS=4, OOM as {judge} says: "
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
    """The hand-built story (FIELD-NOTES s.1: what really happened on that machine) against
    the per-job model's verdict: 128 cores, 4 archs by default, NVCC_THREADS=4."""
    c = cell((80, 90, 100, 120))
    print()
    print("### The story (the hand-built attempts that motivated the factory): 128 cores, "
          "flash-attn's 4 default archs, NVCC_THREADS=4")
    print()
    print("| RAM GiB | MAX_JOBS | per-job model's peak GiB | model says | what really happened "
          "| model right? |")
    print("|---:|---:|---:|---|---|---|")
    wrong = []
    for ram, jobs, happened in STORY:
        p = peak(history, c, jobs, UPSTREAM_THREADS)
        says = "OOM" if p > ram * 1e9 else "fits"
        right = (says == "OOM") == ("OOM" in happened)
        if not right:
            wrong.append(f"{ram * 1e9 / GIB:.0f} GiB / {jobs} jobs ({says}, really: {happened})")
        print(f"| {ram * 1e9 / GIB:.0f} | {jobs} | {p / GIB:.0f} | {says} | {happened} "
              f"| {'yes' if right else '**no**'} |")
    print()
    print(f"- the per-job model is right on {len(STORY) - len(wrong)} of {len(STORY)}; wrong on "
          + ("; ".join(wrong) if wrong else "none")
          + ": its four-arch figure (4 archs x its one-arch per-job peak) is an upper estimate")
    for ram in (288, 432):
        for archs, what in (((80, 90, 100, 120), "4 default archs"), ((100,), "sm_100 only")):
            plan = plan_for(cell(archs), supports_threads=True, memory_model_key="flash-attn",
                            memory=int(ram * 1e9), cpus=128, history=history)
            times = history.object_times(cell(archs), cpus=128)
            print(f"- planner at {ram * 1e9 / GIB:.0f} GiB, 128 cores, {what}: "
                  f"MAX_JOBS={plan.max_jobs} NVCC_THREADS={plan.nvcc_threads}, predicted peak "
                  f"{plan.predicted_peak_bytes / GIB:.0f} GiB, compile "
                  f"{(plan.predicted_seconds or 0) / 60:.0f} min (object times: "
                  f"{times.source if times else 'none'})")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
