"""The ETA a build shows, replayed on every complete ninja log in the repo.

Each run is predicted only from what the factory would have had while it ran: the shipped
history without that run (``history_without``: the run taken out of its record's recorded runs,
and where the record's per-object times were the run's own, the times of the most recent other
run of the same arch set instead), planned at the run's jobs and CPUs (the object times at the
speed the planner takes: planning.spread.calibrate), and at each point of the build the
sampler's view rebuilt from the log (objects finished and how long they took, objects running
and since when). A package the history has no times for (the catalog's four) gets the ETA a
build without a plan shows: the objects measured so far, at their mean (eta.unplanned); the
catalog was built twice on the GPU machine, and each of those runs is also predicted from the
other's record, as a builder that had built the package once has it in its own history (the
file that build wrote: ``RealRun.history``). Beside it the old ETA, elapsed / done x remaining.
Then, for each point outside the goal at 10, 50 and 90 %, the speeds (seconds over predicted
for every object not yet ended) at which the ETA would have met it, beside the speeds the
objects ended by then had run at: where they do not overlap, no ETA that learns one speed
from the finished objects could have met it.

    python benchmarks/eta_replay.py
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.matrix.cell import Cell  # noqa: E402
from factory.planning.eta import EtaModel, model_for, replay_log  # noqa: E402
from factory.planning.history_file import shipped_history_path  # noqa: E402
from factory.planning.memory_model import MemoryHistory  # noqa: E402
from factory.planning.ninja_log import LoggedObject, read_entries, stages_of  # noqa: E402
from factory.planning.planner import calibration  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
CATALOG = GPU / "results-2026-12-01-catalog"
CATALOG_AGAIN = GPU / "results-2026-12-02-catalog"  # the same four cells, built again


@dataclasses.dataclass(frozen=True, kw_only=True)
class RealRun:
    log: Path
    date: str
    jobs: int
    cpus: int
    archs: tuple[int, ...]
    package: str = "flash-attn"
    version: str = "2.8.3.post2"
    machine: str = "2x H200 VM"
    # the memory history this run's build wrote (a catalog run on the GPU machine): what a
    # builder that ran it has in its own history when it builds the package again
    history: Path | None = None

    def cell(self) -> Cell:
        return Cell(package=self.package, version=self.version, torch="2.11.0", cuda="13.0",
                    archs=self.archs, python="3.12")


def _catalog(package: str, version: str, jobs: int, results: Path = CATALOG,
             date: str = "2026-12-01") -> RealRun:
    return RealRun(log=results / f"{package}-{version}-torch2.11.0-cu130-sm90-cp312.ninja_log",
                   date=date, jobs=jobs, cpus=jobs, archs=(90,), package=package,
                   version=version, machine="H200 host, 16 cores",
                   history=results / "memory_history.json")


# Every complete ninja log in the repo (jobs and CPUs as docs/BENCHMARKS.md records the runs).
RUNS = {
    "sm90-16jobs-setup.py-order": RealRun(
        log=ROOT / "factory/data/flash-attn-2.8.3.post2_sm90_h200_16jobs.ninja_log",
        date="2026-11-28", jobs=16, cpus=16, archs=(90,), machine="H200 host, 16 cores"),
    "sm90-16jobs-longest-first": RealRun(
        log=GPU / "results-2026-11-29/sm90_16jobs_longest_first.ninja_log",
        date="2026-11-29", jobs=16, cpus=16, archs=(90,)),
    "sm90-9jobs": RealRun(
        log=GPU / "results-2026-11-29-h200x2/flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312"
        ".ninja_log", date="2026-11-29", jobs=9, cpus=16, archs=(90,)),
    "sm100-9jobs": RealRun(
        log=GPU / "results-2026-11-29-h200x2/flash-attn-2.8.3.post2-torch2.11.0-cu130-sm100-cp312"
        ".ninja_log", date="2026-11-29", jobs=9, cpus=16, archs=(100,)),
    "sm90-32jobs": RealRun(
        log=GPU / "results-2026-12-01-h200x2/flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312"
        ".ninja_log", date="2026-12-01", jobs=32, cpus=32, archs=(90,)),
    "sm100-flagship-2jobs": RealRun(
        log=ROOT / "benchmarks/results-2026-12-01-flagship/cp311.ninja_log", date="2026-12-01",
        jobs=2, cpus=2, archs=(100,), machine="the 2-core builder, shared"),
    # the same cell rebuilt there a day later with --cache (a cold cache: every object
    # compiled), the builder otherwise idle, on another CPU model
    "sm100-flagship-again": RealRun(
        log=ROOT / "benchmarks/results-2026-12-02-flagship/cp311-again.ninja_log",
        date="2026-12-02", jobs=2, cpus=2, archs=(100,), machine="the 2-core builder, idle"),
    # the catalog's sm_90 cells built side by side on one H200 machine, each in its own cgroup
    "causal-conv1d": _catalog("causal-conv1d", "1.7.0", 4),
    "grouped-gemm": _catalog("grouped-gemm", "0.3.0", 3),
    "mamba-ssm": _catalog("mamba-ssm", "2.3.2.post1", 10),
    "torch-scatter": _catalog("torch-scatter", "2.1.2", 3),
    # the same four, a day later on the same kind of machine, each predicted from the first
    **{f"{package}-again": _catalog(package, version, jobs, CATALOG_AGAIN, "2026-12-02")
       for package, version, jobs in (("causal-conv1d", "1.7.0", 4), ("grouped-gemm", "0.3.0", 3),
                                      ("mamba-ssm", "2.3.2.post1", 10),
                                      ("torch-scatter", "2.1.2", 3))},
}
# Ninja logs in the repo that are not replayed, and why (tests/unit/test_eta.py checks that
# every .ninja_log is in RUNS or here).
NOT_REPLAYED = {
    ROOT / "factory/data/flash-attn-2.8.3.post2_sm90+sm100_h200_8jobs_2threads.partial.ninja_log":
        "13 of 73 objects: the build was stopped, so what remained is not known",
    ROOT / "benchmarks/results-2026-12-02-flagship/cp313.ninja_log":
        "the flagship's second Python with the cache warm: 72 of 73 objects came from the "
        "cache (its object times are the cache's, not compiles the ETA predicts)",
    # the multi-cell run checks the schedule (whole cells on builders), not the ETA in a build
    **{ROOT / "benchmarks/results-2026-12-02-multicell"
       / f"factory-example-ext-0.1.0-torch2.14.1-cu130-sm{arch}-cp311.ninja_log":
       "2 objects per build: the multi-cell run measures the schedule, not the in-build ETA"
       for arch in (80, 86, 90, 120)},
}
POINTS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)
GOAL = 0.20  # issue 26: within 20 % of what remained at 10, 50 and 90 % of the build
GOAL_POINTS = (0.1, 0.5, 0.9)
# the speeds the search below tries: 0.2x to 10x the prediction, 1 % apart
SPEEDS = tuple(0.2 * 50 ** (i / 400) for i in range(401))


def timeline(name: str) -> list[LoggedObject]:
    """Every compile of the log on one clock, in start order: its ninja runs end to end, an
    output compiled again as ``<key>#<n>`` (planning.ninja_log.read_entries, as the factory
    records a build)."""
    return read_entries(RUNS[name].log)


def ninja_counts(name: str, at: float) -> tuple[int, int | None]:
    """What ninja's ``[N/M]`` lines have said ``at`` seconds in (ninja prints one as each object
    ends, M counting its own run's objects): objects ended, and the objects of the runs that
    have printed one (None before the first)."""
    objects = timeline(name)
    done = sum(1 for o in objects if o.end <= at)
    told = {o.stage for o in objects if o.end <= at}
    return done, (sum(1 for o in objects if o.stage in told) if told else None)


def _same(record: dict[str, object], name: str) -> bool:
    """Whether a history's run record is run ``name`` (its jobs, CPUs and compile span)."""
    run, objects = RUNS[name], timeline(name)
    span = max(o.end for o in objects) - min(o.start for o in objects)
    return (record.get("max_jobs"), record.get("cpus")) == (run.jobs, run.cpus) and abs(
        float(record.get("compile_seconds", 0.0)) - span) < 1.0  # type: ignore[arg-type]


def history_without(name: str) -> MemoryHistory:
    """The shipped history as the factory would have had it without run ``name``."""
    run = RUNS[name]
    doc = MemoryHistory.load(shipped_history_path()).as_document()
    # the package's records from its other runs' builds, as the builder's own history has them
    # (its times read from that run's ninja log as the recorder reads it now: a compile
    # repeated by a second ninja run as its own object, and the runs in order, where the
    # recorder of the GPU run's day kept only the last compile of each output)
    for other, r in RUNS.items():
        if other != name and r.package == run.package and r.history is not None:
            logged = read_entries(r.log)
            doc["objects"] += [{**e, "seconds": {o.key: o.seconds for o in logged},
                                "stages": stages_of(logged)}
                               for e in MemoryHistory.load(r.history).as_document()["objects"]
                               if e["package"] == run.package]
    for entry in doc["objects"]:
        if (entry["package"], tuple(entry["archs"])) != (run.package, run.archs):
            continue
        own = run.log.name in str(entry.get("source", "")) or any(
            r.get("supplied_times") and _same(r, name) for r in entry.get("runs", []))
        entry["runs"] = [r for r in entry.get("runs", []) if not _same(r, name)]
        if not own:
            continue
        # its times were this run's: the most recent other run of the arch set supplies them
        others = [n for n, r in RUNS.items() if n != name and r.archs == run.archs
                  and r.package == run.package]
        other = max(others, key=lambda n: RUNS[n].date)
        other_log = read_entries(RUNS[other].log)
        entry.update(seconds={o.key: o.seconds for o in other_log}, stages=stages_of(other_log),
                     max_jobs=RUNS[other].jobs,
                     cpus=RUNS[other].cpus,
                     source=f"{other}: {RUNS[other].log.name} (instead of the replayed run's)")
        entry["runs"] = [{**r, "supplied_times": True} if _same(r, other) else
                         {k: v for k, v in r.items() if k != "supplied_times"}
                         for r in entry["runs"]]
    return MemoryHistory(doc, path=None)


def model_of(name: str, spread: tuple[float, float] = (1.0, 1.0)) -> EtaModel | None:
    """The ETA model the factory would have had for this run, never from its own times; None
    for a package with no object times in the history."""
    run = RUNS[name]
    h = history_without(name)
    times = h.object_times(run.cell(), cpus=run.cpus)
    if times is None:
        return None
    speed = calibration(run.cell(), h, cpus=run.cpus, model_key=run.package).speed
    return model_for(times, archs=len(run.archs), jobs=run.jobs, threads=1, cpus=run.cpus,
                     spread=spread, speed=speed)


def predicted_from(name: str) -> str:
    """Whose times the run is predicted from, and at what speed, in words."""
    run = RUNS[name]
    h = history_without(name)
    times = h.object_times(run.cell(), cpus=run.cpus)
    if times is None:
        return "no object times: the objects measured so far"
    cal = calibration(run.cell(), h, cpus=run.cpus, model_key=run.package)
    whose = next((n for n in RUNS if times.source.startswith(f"{n}: ")), None) or next(
        (n for n, r in RUNS.items() if r.log.name in times.source), None) or next(
        n for n, r in RUNS.items() if (r.package, r.archs, r.jobs, r.cpus) == (
            run.package, times.archs, times.max_jobs, times.cpus) and r.date in times.source)
    speed = (f" x {cal.speed:.2f} (the speed of the {cal.speed_from.date} "
             f"{cal.speed_from.max_jobs}-job run)" if cal.speed_from else "")
    return f"{whose}'s times{speed}"


@functools.cache
def _model(name: str) -> EtaModel | None:
    return model_of(name)


def errors(name: str, fraction: float, speed: float | None = None
           ) -> tuple[float | None, float | None]:
    """(the ETA's error, the old count-based ETA's error) against what really remained, as
    fractions; None where it showed no ETA (no plan and no object ended; the old ETA before
    the first object ended). ``speed``: the ETA replayed at that speed instead of the one it
    learnt (EtaModel.estimate)."""
    objects = timeline(name)
    span = max(o.end for o in objects)
    at = fraction * span
    done, told = ninja_counts(name, at)
    eta = replay_log(_model(name), objects, at, jobs=RUNS[name].jobs, done=done, total=told,
                     speed=speed)
    naive = at / done * (len(objects) - done) if done else None
    left = span - at
    return (eta.remaining / left - 1.0 if eta is not None else None,
            naive / left - 1.0 if naive is not None else None)


def speeds_shown(name: str, fraction: float) -> tuple[float, float, int] | None:
    """The slowest and fastest any object that had ended by then ran, as its seconds over the
    plan's prediction for it, and how many had ended; None when none had (or no plan)."""
    model, objects = _model(name), timeline(name)
    at = fraction * max(o.end for o in objects)
    ratios = [(o.end - o.start) / model.predicted[o.key] for o in objects
              if model is not None and o.end <= at and model.predicted.get(o.key)]
    return (min(ratios), max(ratios), len(ratios)) if ratios else None


def speeds_needed(name: str, fraction: float) -> tuple[float, float] | None:
    """The slowest and fastest speed (SPEEDS) at which the ETA, replaying every object not
    ended at that speed, is within GOAL of what remained; None when no speed is (or no plan)."""
    if _model(name) is None:
        return None
    ok = [s for s in SPEEDS if abs(errors(name, fraction, speed=s)[0] or 0.0) <= GOAL]
    return (min(ok), max(ok)) if ok else None


def reachable(name: str, fraction: float) -> bool:
    """Whether some speed the build had shown by then (between the slowest and fastest object
    ended) puts the ETA within the goal: what any ETA that learns one speed from the finished
    objects, however it weighs them, could have said."""
    shown, needed = speeds_shown(name, fraction), speeds_needed(name, fraction)
    return bool(shown and needed and needed[0] <= shown[1] and shown[0] <= needed[1])


def main() -> int:
    head = " | ".join(f"{int(f * 100)} %" for f in POINTS)
    print(f"| run | machine | jobs / CPUs | objects | span s | predicted from | {head} |")
    print("|---|---|---:|---:|---:|---|" + "---:|" * len(POINTS))
    for name, run in RUNS.items():
        objects = timeline(name)
        span = max(o.end for o in objects)
        cells = []
        for f in POINTS:
            eta, naive = errors(name, f)
            old = f"{naive:+.0%}" if naive is not None else "-"
            cells.append(f"{eta:+.1%} ({old})" if eta is not None else f"- ({old})")
        print(f"| {name} | {run.machine} | {run.jobs} / {run.cpus} | {len(objects)} | {span:.0f} "
              f"| {predicted_from(name)} | {' | '.join(cells)} |")
    print()
    print("Points outside the goal, and the speeds that would have met it:")
    print()
    print("| run, point | ETA's error | objects ended | speeds they showed | speeds that meet "
          "the goal | reachable from what the build showed |")
    print("|---|---:|---:|---|---|---|")
    for name in RUNS:
        for f in GOAL_POINTS:
            eta, _ = errors(name, f)
            if eta is None or abs(eta) <= GOAL:
                continue
            shown, needed = speeds_shown(name, f), speeds_needed(name, f)
            print(f"| {name}, {int(f * 100)} % | {eta:+.1%} | {shown[2] if shown else 0} | "
                  f"{f'{shown[0]:.2f}-{shown[1]:.2f}x' if shown else '-'} | "
                  f"{f'{needed[0]:.2f}-{needed[1]:.2f}x' if needed else 'none'} | "
                  f"{'yes' if reachable(name, f) else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
