"""The per-object replay (factory.planning.replay) against every real flash-attn run in the repo.

Per-object peaks: the shipped figures (factory/data/memory_history.json, "peak_bytes") come
from the two 16-job sm_90 runs, whose peaks both fall ~40 s in, with all 16 front ends at once:
setup.py's order (16 backward kernels, 67.0 GiB used above idle) gives a backward kernel
67.0 / 16 GiB; longest first (12 split-KV + 4 backward kernels, 56.25 GiB) gives the other
kernels (56.25 - 4 x that) / 12. ``--fit`` prints them. The two 9-job runs (sm_90 and sm_100
under 48 GiB, 2026-11-29) were not used to fit: their figures test it.

Each run is replayed in its own start order (from its ninja log) with the shipped figures:
peak = replayed compile peak + the measured non-compile memory; span = the list schedule of the
object times of ANOTHER run of the same arch (their contention removed, the run's added):
sm_90 runs from the FIELD-NOTES baseline log, the baseline from the longest-first run's log
(same machine kind, 14 % slower cores: scaled by the ratio of the two logs' sums), sm_100 from
its own log (the only sm_100 run; a self-check).

    python benchmarks/replay_real_runs.py [--fit]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.planning.memory_model import (  # noqa: E402
    MemoryHistory,
    object_key,
    shipped_history_path,
)
from factory.planning.planner import list_schedule  # noqa: E402
from factory.planning.replay import contention_factor, replay  # noqa: E402
from factory.units import GIB  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "factory" / "data"
GPU = ROOT / "benchmarks" / "gpu"
BASE = DATA / "flash-attn-2.8.3.post2_sm90_h200_16jobs.ninja_log"
LF = GPU / "results-2026-11-29" / "sm90_16jobs_longest_first.ninja_log"
X2 = GPU / "results-2026-11-29-h200x2"
SM90 = X2 / "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312.ninja_log"
SM100 = X2 / "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm100-cp312.ninja_log"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    name: str
    log: Path
    jobs: int
    cpus: int
    measured_peak_gib: float
    peak_how: str
    measured_span: float  # the compile's wall time (ninja's span)
    times_from: Path


def starts(log: Path) -> list[tuple[str, float, float]]:
    """(object key, start s, end s) in start order, the last entry of an output winning."""
    out: dict[str, tuple[float, float]] = {}
    for line in log.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        f = line.split("\t")
        out[object_key(f[3])] = (int(f[0]) / 1000, int(f[1]) / 1000)
    return sorted(((k, s, e) for k, (s, e) in out.items()), key=lambda x: (x[1], x[0]))


# Used above idle in the last sample before ninja started (setup.py with torch imported, ninja):
# 371 MiB (baseline), 477 MiB (longest-first run). The larger is the non-compile memory.
NON_COMPILE_MIB = 477
# After the last compile, the link of the .so: 2026-2168 MiB above idle (longest-first run).
LINK_MIB = 2168


def fit() -> dict[str, int]:
    # The 16 objects running at the peak sample of each run (40 s and 37 s in), less the
    # non-compile memory that was there too.
    bwd = (67.0087890625 - NON_COMPILE_MIB / 1024) / 16  # (69126 - 509) MiB used, 16 bwd
    other = (56.25 - NON_COMPILE_MIB / 1024 - 4 * bwd) / 12  # (58197 - 597), 4 bwd + 12 split
    keys = [k for k, _, _ in starts(BASE)]
    return {k: int((bwd if "flash_bwd" in k else other) * GIB) for k in keys}


RUNS = (
    Run(name="sm_90, 16 jobs, setup.py order (FIELD-NOTES s.3)", log=BASE, jobs=16, cpus=16,
        measured_peak_gib=67.01, peak_how="host used - idle", measured_span=1179.1,
        times_from=LF),
    Run(name="sm_90, 16 jobs, longest first, 64 GiB cap", log=LF, jobs=16, cpus=16,
        measured_peak_gib=56.25, peak_how="host used - idle", measured_span=1218.5,
        times_from=BASE),
    Run(name="sm_90, 9 jobs, 48 GiB / 16 CPUs", log=SM90, jobs=9, cpus=16,
        measured_peak_gib=39609733120 / GIB, peak_how="compiler RSS sum (provenance)",
        measured_span=0.0, times_from=BASE),
    Run(name="sm_100, 9 jobs, 48 GiB / 16 CPUs", log=SM100, jobs=9, cpus=16,
        measured_peak_gib=37413933056 / GIB, peak_how="compiler RSS sum (provenance)",
        measured_span=0.0, times_from=SM100),
)


def times_of(log: Path) -> dict[str, float]:
    return {k: e - s for k, s, e in starts(log)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="print the fitted per-object peaks")
    args = ap.parse_args(argv)
    if args.fit:
        for k, v in fit().items():
            print(f"{k}\t{v}")
        return 0
    history = MemoryHistory.load(shipped_history_path())
    non_compile = history.non_compile_bytes("flash-attn")
    entry = next(e for e in history.as_document()["objects"]
                 if e["package"] == "flash-attn" and e["archs"] == [90])
    peaks = {k: int(v) for k, v in entry["peak_bytes"].items()}
    print("| run | jobs | measured peak GiB | how | predicted GiB | error | measured span s "
          "| predicted span s | error | object times from |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---|")
    worst_peak = worst_span = 0.0
    for run in RUNS:
        order = starts(run.log)
        span = run.measured_span or max(e for _, _, e in order)
        r = replay([(e - s, peaks[k]) for k, s, e in order], run.jobs)
        predicted = (r.peak_bytes + non_compile) / GIB
        # Object times of another run (its 16-job contention removed, this run's added),
        # scaled to this run's cores by the ratio of the two logs' sums of object times.
        other = times_of(run.times_from)
        own = times_of(run.log)
        speed = sum(own.values()) / sum(other.values())
        here = contention_factor(run.jobs, run.cpus) / contention_factor(16, 16)
        durations = [other[k] * speed * here for k, _, _ in order]
        predicted_span = list_schedule(durations, run.jobs)
        e_peak = predicted / run.measured_peak_gib - 1
        e_span = predicted_span / span - 1
        worst_peak, worst_span = max(worst_peak, abs(e_peak)), max(worst_span, abs(e_span))
        print(f"| {run.name} | {run.jobs} | {run.measured_peak_gib:.1f} | {run.peak_how} | "
              f"{predicted:.1f} | {100 * e_peak:+.1f} % | {span:.0f} | {predicted_span:.0f} | "
              f"{100 * e_span:+.1f} % | {run.times_from.name} |")
    print(f"\nworst peak error {100 * worst_peak:.1f} %, worst span error {100 * worst_span:.1f} %"
          f" (non-compile memory {non_compile / GIB:.2f} GiB added to every replayed peak)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
