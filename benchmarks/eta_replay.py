"""The ETA a build shows, replayed on every complete flash-attn ninja log in the repo.

Each run is predicted as the factory would have predicted it: from the shipped history's
per-object times (another run's), and the run the shipped history was made from from another
run again; never from its own times. At each point of the build the sampler's view is rebuilt
from the log (objects finished and how long they took, objects running and since when), and
the ETA (factory.planning.eta) is compared with what really remained; beside it the old ETA,
elapsed / done x remaining.

    python benchmarks/eta_replay.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from factory.matrix.cell import Cell
from factory.planning.eta import EtaModel, model_for, replay_log
from factory.planning.memory_model import MemoryHistory, ObjectTimes
from factory.planning.ninja_log import read_ninja_timeline

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"


@dataclasses.dataclass(frozen=True)
class RealRun:
    log: Path
    archs: tuple[int, ...]
    jobs: int
    cpus: int


# Every complete ninja log in the repo (jobs and CPUs as docs/BENCHMARKS.md records the runs).
RUNS = {
    "sm90-16jobs-setup.py-order": RealRun(
        ROOT / "factory/data/flash-attn-2.8.3.post2_sm90_h200_16jobs.ninja_log", (90,), 16, 16),
    "sm90-16jobs-longest-first": RealRun(
        GPU / "results-2026-11-29/sm90_16jobs_longest_first.ninja_log", (90,), 16, 16),
    "sm90-9jobs": RealRun(
        GPU / "results-2026-11-29-h200x2/flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312"
        ".ninja_log", (90,), 9, 16),
    "sm100-9jobs": RealRun(
        GPU / "results-2026-11-29-h200x2/flash-attn-2.8.3.post2-torch2.11.0-cu130-sm100-cp312"
        ".ninja_log", (100,), 9, 16),
    "sm90-32jobs": RealRun(
        GPU / "results-2026-12-01-h200x2/flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312"
        ".ninja_log", (90,), 32, 32),
}
# The shipped history's object times are this run's; it is predicted from another one.
SHIPPED_FROM = "sm90-16jobs-setup.py-order"
INSTEAD = "sm90-16jobs-longest-first"
POINTS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)


def times_of(name: str) -> ObjectTimes:
    run = RUNS[name]
    seconds = {o.key: o.end - o.start for o in read_ninja_timeline(run.log)}
    return ObjectTimes(package="flash-attn", version="2.8.3.post2", cuda="13.0", archs=run.archs,
                       nvcc_threads=1, seconds=seconds, source=run.log.name,
                       max_jobs=run.jobs, cpus=run.cpus)


def predicted_from(name: str) -> str:
    """Whose times the run is predicted from (a log's name)."""
    return RUNS[INSTEAD if name == SHIPPED_FROM else SHIPPED_FROM].log.name


def model_of(name: str, spread: tuple[float, float] = (1.0, 1.0)) -> EtaModel:
    """The ETA model the factory would have had for this run, never from its own times."""
    run = RUNS[name]
    if name == SHIPPED_FROM:
        times = times_of(INSTEAD)
    else:
        cell = Cell(package="flash-attn", version="2.8.3.post2", torch="2.11.0", cuda="13.0",
                    archs=run.archs, python="3.12")
        found = MemoryHistory.load().object_times(cell)
        if found is not None and found.source.startswith(RUNS[SHIPPED_FROM].log.name):
            times = found
        else:
            # The history picks another record for this cell (sm_100: the flagship cell built
            # on the 2-core builder at 2 jobs): the H200 16-job log's times instead, so that
            # the replay measures the ETA, not which record the history holds.
            times = times_of(SHIPPED_FROM)
    model = model_for(times, archs=len(run.archs), jobs=run.jobs, threads=1, cpus=run.cpus,
                      spread=spread)
    assert model is not None
    return model


def errors(name: str, fraction: float) -> tuple[float, float | None]:
    """(the ETA's error, the old count-based ETA's error) against what really remained, as
    fractions; None where no object had ended (the old ETA says nothing)."""
    timeline = read_ninja_timeline(RUNS[name].log)
    span = max(o.end for o in timeline)
    at = fraction * span
    eta = replay_log(model_of(name), timeline, at)
    done = sum(1 for o in timeline if o.end <= at)
    naive = at / done * (len(timeline) - done) if done else None
    left = span - at
    return eta.remaining / left - 1.0, (naive / left - 1.0 if naive is not None else None)


def main() -> int:
    head = " | ".join(f"{int(f * 100)} %" for f in POINTS)
    print(f"| run | span s | predicted from | {head} |")
    print("|---|---:|---|" + "---:|" * len(POINTS))
    for name, run in RUNS.items():
        span = max(o.end for o in read_ninja_timeline(run.log))
        cells = []
        for f in POINTS:
            eta, naive = errors(name, f)
            old = f"{naive:+.0%}" if naive is not None else "-"
            cells.append(f"{eta:+.1%} ({old})")
        print(f"| {name} ({run.jobs} jobs, {run.cpus} CPUs) | {span:.0f} | {predicted_from(name)}"
              f" | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
