"""Every real flash-attn run in the repo, each predicted only from what came before it.

The rule: a run is predicted from the runs recorded before it (by date) and nothing of its
own, the way the planner uses its history:

- compile time: the earlier runs' per-object seconds (each with its own contention divided
  out, factory.planning.replay) in longest-first order on this run's jobs, at this run's
  contention. The planner's own choice is an earlier run of the same arch set, else of another
  (object times are ranked the same way in MemoryHistory.object_times): of those, the nearest
  this run's CPU count, the most recent of equals, passing over a run starved of CPUs
  (object_times.nearest_times); the spread over every earlier run is shown beside it. No
  run's own totals enter its prediction (``predict_span`` takes the earlier run and this run's
  jobs and CPUs, nothing else).
- peak: the per-object replay (factory.planning.replay) where per-object peaks were known
  before the run: the peaks fitted on the two 16-job sm_90 runs (``--fit``), or peaks the
  sampler recorded in an earlier run of the same arch set; in this run's start order, with
  the planner's durations. Otherwise the per-job model the planner fell back to: the largest
  per-job peak of the earlier runs, the heaviest object (6.7 GiB, measured alone on
  2026-11-29, before the second GPU run) for the first two jobs.
- in-sample: a run whose own figures are in its prediction is marked so (the two 16-job runs
  are the per-object fit's inputs).

Measured peaks are what each run measured: "host" is the host's used memory above idle
(compilers + setup.py and ninja: the replay adds the measured 0.47 GiB for them); "compilers"
is the runners' sampler's summed RSS of the compiler processes. Every memory figure is GiB.

    python benchmarks/replay_real_runs.py [--fit | --history-runs]

``--history-runs`` prints the runs as the memory history records them (RecordedRun, per arch
set, each with its own object times): how factory/data/memory_history.json's "runs" were made
(the flagship run's times are its entry's own: benchmarks/flagship_results.py ship).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flagship_results import _cpu  # noqa: E402  (the flagship build's container CPU seconds)

from factory.planning.history_file import shipped_history_path  # noqa: E402
from factory.planning.memory_model import MemoryHistory  # noqa: E402
from factory.planning.ninja_log import LoggedObject, compile_span, read_entries  # noqa: E402
from factory.planning.object_times import RecordedRun  # noqa: E402
from factory.planning.planner import HEAVY_JOBS  # noqa: E402
from factory.planning.replay import (  # noqa: E402
    contention_factor,
    list_schedule,  # noqa: E402
    replay,
)
from factory.units import GIB  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "factory" / "data"
GPU = ROOT / "benchmarks" / "gpu"
BASE = DATA / "flash-attn-2.8.3.post2_sm90_h200_16jobs.ninja_log"
LF = GPU / "results-2026-11-29" / "sm90_16jobs_longest_first.ninja_log"
X2 = GPU / "results-2026-11-29-h200x2"
SM90 = X2 / "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312.ninja_log"
SM100 = X2 / "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm100-cp312.ninja_log"
X3 = GPU / "results-2026-12-01-h200x2"
SM90_32 = X3 / "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312.ninja_log"
FLAGSHIP = ROOT / "benchmarks" / "results-2026-12-01-flagship"
FLAGSHIP_AGAIN = ROOT / "benchmarks" / "results-2026-12-02-flagship"

# Used above idle in the last sample before ninja started (setup.py with torch imported, ninja):
# 371 MiB (baseline), 477 MiB (longest-first run). The larger is the non-compile memory.
NON_COMPILE_MIB = 477
HEAVIEST_OBJECT_GIB = 7159746560 / GIB  # flash_bwd_hdim256 alone, 2026-11-29 (BENCHMARKS.md)
HEAVIEST_KNOWN_FROM = 3  # the first run planned with it (the second GPU run)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One real build, in the order the runs happened (``order``)."""

    order: int
    name: str
    date: str
    log: Path
    archs: tuple[int, ...]
    jobs: int
    cpus: int
    peak_gib: float  # what the run measured
    peak_of: str  # "host" or "compilers"
    machine: str
    # per-object peaks the sampler recorded in this run (object key -> bytes); {}: none
    object_peaks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    fit_input: bool = False  # its peak is an input of the per-object fit
    # built in the order the factory writes into build.ninja (longest first); the baseline ran
    # in setup.py's order, so its span and peak are not what a plan replays
    factory_order: bool = True
    # CPU seconds its build used (its container's; None: not measured)
    cpu_seconds: float | None = None

    def entries(self) -> list[LoggedObject]:
        return read_entries(self.log)

    def seconds(self) -> dict[str, float]:
        return {o.key: o.seconds for o in self.entries()}

    def span(self) -> float:
        return compile_span(self.entries())

    def record(self) -> RecordedRun:
        """The run as the history records it (the planner's rules read it there)."""
        return RecordedRun(source=self.name, date=self.date, max_jobs=self.jobs, cpus=self.cpus,
                           compile_seconds=self.span(), seconds=self.seconds(),
                           cpu_seconds=self.cpu_seconds)


def _peaks_of(history_file: Path, archs: list[int]) -> dict[str, int]:
    """The per-object peaks a run's own memory history recorded (sampler), objects only."""
    if not history_file.exists():
        return {}
    doc = json.loads(history_file.read_text())
    for e in doc.get("objects", []):
        if e.get("archs") == archs:
            keys = set(e.get("seconds", {}))
            return {k: int(v) for k, v in e.get("peak_bytes", {}).items() if k in keys}
    return {}


def _flagship() -> tuple[Run, ...]:
    """The default matrix's flash-attn sm_100 cell built on the 2-core builder, if its
    results are in the repo (benchmarks/flagship_results.py collect): the first build
    (2026-12-01, the builder shared) and its rebuild with a cold --cache (2026-12-02, idle)."""
    runs = []
    for order, meta in ((6, FLAGSHIP / "cp311.json"), (7, FLAGSHIP_AGAIN / "cp311-again.json")):
        if not meta.exists():
            continue
        m = json.loads(meta.read_text())
        runs.append(Run(
            order=order, name=m["name"], date=m["date"], log=meta.parent / m["ninja_log"],
            archs=(100,), jobs=int(m["jobs"]), cpus=int(m["cpus"]),
            peak_gib=int(m["compile_peak_rss_bytes"]) / GIB, peak_of="compilers",
            machine=m["machine"] + f", docker cap {m['memory_limit_bytes'] / GIB:.0f} GiB"
            f" / {m['cpus']} CPUs",
            object_peaks={str(k): int(v) for k, v in m["object_peak_rss_bytes"].items()},
            cpu_seconds=_cpu(m)))
    return tuple(runs)


H200_VM = "2x H200 VM, 32 cores, 251 GiB"
RUNS: tuple[Run, ...] = (
    Run(order=1, name="sm_90, 16 jobs, setup.py order (FIELD-NOTES s.3)", date="before 2026-11-29",
        log=BASE, archs=(90,), jobs=16, cpus=16, peak_gib=67.01, peak_of="host",
        machine="H200 host, 16 cores, 128 GB", fit_input=True, factory_order=False),
    Run(order=2, name="sm_90, 16 jobs, longest first, 64 GiB cap", date="2026-11-29", log=LF,
        archs=(90,), jobs=16, cpus=16, peak_gib=56.25, peak_of="host",
        machine=H200_VM + ", cap 64 GiB / 16 CPUs", fit_input=True),
    Run(order=3, name="sm_90, 9 jobs, 48 GiB / 16 CPUs", date="2026-11-29", log=SM90,
        archs=(90,), jobs=9, cpus=16, peak_gib=39609733120 / GIB, peak_of="compilers",
        machine=H200_VM + ", cap 48 GiB / 16 CPUs"),
    Run(order=4, name="sm_100, 9 jobs, 48 GiB / 16 CPUs", date="2026-11-29", log=SM100,
        archs=(100,), jobs=9, cpus=16, peak_gib=37413933056 / GIB, peak_of="compilers",
        machine=H200_VM + ", cap 48 GiB / 16 CPUs"),
    Run(order=5, name="sm_90, 32 jobs, 160 GiB / 32 CPUs", date="2026-12-01", log=SM90_32,
        archs=(90,), jobs=32, cpus=32, peak_gib=125030621184 / GIB, peak_of="compilers",
        machine=H200_VM + ", cap 160 GiB / 32 CPUs",
        object_peaks=_peaks_of(X3 / "memory_history.json", [90])),
) + _flagship()


def fit() -> dict[str, int]:
    """The per-object peaks fitted on the two 16-job runs (the shipped sm_90 figures): the 16
    objects running at the peak sample of each run (40 s and 37 s in), less the non-compile
    memory that was there too."""
    bwd = (67.0087890625 - NON_COMPILE_MIB / 1024) / 16  # (69126 - 509) MiB used, 16 bwd
    other = (56.25 - NON_COMPILE_MIB / 1024 - 4 * bwd) / 12  # (58197 - 597), 4 bwd + 12 split
    keys = [o.key for o in read_entries(BASE)]
    return {k: int((bwd if "flash_bwd" in k else other) * GIB) for k in keys}


def alone(run: Run) -> dict[str, float]:
    """The run's object seconds with its own contention divided out."""
    factor = contention_factor(run.jobs, run.cpus)
    return {k: v / factor for k, v in run.seconds().items()}


def predict_span(times_from: Run, jobs: int, cpus: int) -> float:
    """The planner's compile time for ``jobs`` jobs on ``cpus`` CPUs from another run's
    object times: longest first (critical_path's order), at this contention. Only the
    earlier run's figures and the two counts go in."""
    seconds = sorted(alone(times_from).values(), reverse=True)
    factor = contention_factor(jobs, cpus)
    return list_schedule([s * factor for s in seconds], jobs)


def candidates(run: Run, earlier: Sequence[Run]) -> list[Run]:
    """The earlier runs whose object times the planner could use: those of the same arch
    set, else every earlier run (MemoryHistory.object_times ranks the same archs first)."""
    same = [r for r in earlier if r.archs == run.archs]
    return same or list(earlier)


def planner_times(run: Run, earlier: Sequence[Run]) -> Run | None:
    """The earlier run whose object times the planner would have used, by its rule
    (object_times.nearest_times): of the candidates, those not starved of CPUs where any is
    (RecordedRun.starved), the nearest this run's CPU count (ratio of the counts), the most
    recent of equals."""
    pool = candidates(run, earlier)
    fed = [r for r in pool if not r.record().starved()]
    return min(fed or pool, key=lambda r: (abs(math.log(r.cpus / run.cpus)), -r.order),
               default=None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    run: Run
    measured_span: float
    span_from: Run | None
    predicted_span: float | None
    span_errors: tuple[float, ...]  # over every candidate earlier run's times
    peak_model: str
    predicted_peak_gib: float | None
    in_sample: bool

    @property
    def span_error(self) -> float | None:
        if self.predicted_span is None:
            return None
        return self.predicted_span / self.measured_span - 1

    @property
    def peak_error(self) -> float | None:
        if self.predicted_peak_gib is None:
            return None
        return self.predicted_peak_gib / self.run.peak_gib - 1


def object_peaks_before(run: Run, earlier: Sequence[Run]) -> tuple[dict[str, int], str, bool]:
    """Per-object peaks known before ``run`` for its arch set: the sampler's from earlier
    runs (the largest per object, as the history keeps them), else the fit of the two 16-job
    sm_90 runs (for sm_90; in-sample for those two runs themselves). ({}, "", _): none."""
    sampled: dict[str, int] = {}
    for r in earlier:
        if r.archs == run.archs:
            for k, v in r.object_peaks.items():
                sampled[k] = max(v, sampled.get(k, 0))
    if sampled:
        return sampled, "per-object replay, peaks sampled in earlier runs", False
    fitted = run.archs == (90,) and (run.fit_input or any(r.fit_input for r in earlier))
    if fitted:
        return fit(), "per-object replay, fitted peaks", run.fit_input
    return {}, "", False


def per_job_peak(run: Run, earlier: Sequence[Run]) -> tuple[float | None, str]:
    """The per-job model's compile peak for ``run`` from earlier runs (GiB), or None."""
    figures = [r.peak_gib / r.jobs for r in earlier if r.peak_of == "host"] + [
        r.peak_gib / r.jobs for r in earlier if r.peak_of == "compilers"]
    if not figures:
        return None, "no earlier run"
    per_job = max(figures)
    heavy = HEAVIEST_OBJECT_GIB if run.order >= HEAVIEST_KNOWN_FROM else per_job
    first = min(run.jobs, HEAVY_JOBS)
    gib = first * max(heavy, per_job) + (run.jobs - first) * per_job
    return gib + (NON_COMPILE_MIB / 1024 if run.peak_of == "host" else 0.0), (
        f"per-job model ({per_job:.2f} GiB per job"
        + (f", first {HEAVY_JOBS} at {heavy:.2f}" if heavy > per_job else "") + ")")


def predict(runs: Sequence[Run]) -> list[Row]:
    """Each run from the runs before it (by ``order``), nothing of its own."""
    rows = []
    ordered = sorted(runs, key=lambda r: r.order)
    for i, run in enumerate(ordered):
        earlier = ordered[:i]
        measured = run.span()
        source = planner_times(run, earlier)
        predicted = predict_span(source, run.jobs, run.cpus) if source else None
        errors = tuple(predict_span(q, run.jobs, run.cpus) / measured - 1
                       for q in candidates(run, earlier))
        peaks, how, in_sample = object_peaks_before(run, earlier)
        peak: float | None
        if peaks:
            order = run.entries()
            times = alone(source) if source else alone(run)
            if source is None:
                in_sample = True  # no earlier run: its own durations
            factor = contention_factor(run.jobs, run.cpus)
            heaviest = max(peaks.values())
            longest = max(times.values())  # an object the earlier run lacks: its longest
            objects = [(times.get(o.key, longest) * factor, peaks.get(o.key, heaviest))
                       for o in order]
            gib = replay(objects, run.jobs).peak_bytes / GIB
            peak = gib + (NON_COMPILE_MIB / 1024 if run.peak_of == "host" else 0.0)
        else:
            peak, how = per_job_peak(run, earlier)
        rows.append(Row(run=run, measured_span=measured, span_from=source,
                        predicted_span=predicted, span_errors=errors, peak_model=how,
                        predicted_peak_gib=peak, in_sample=in_sample))
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def table(rows: Sequence[Row]) -> list[str]:
    out = [
        "| # | run | date | machine | jobs / CPUs | measured peak GiB (of) | predicted peak GiB "
        "| model before the run | peak error | measured compile s | predicted s (times of) "
        "| error | every candidate earlier run's times |",
        "|---:|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        run = r.run
        peak = "-" if r.predicted_peak_gib is None else f"{r.predicted_peak_gib:.1f}"
        model = r.peak_model + (" **(in-sample: fit input)**" if r.in_sample else "")
        span = "-" if r.predicted_span is None or r.span_from is None else (
            f"{r.predicted_span:.0f} (#{r.span_from.order})")
        spread = ("-" if not r.span_errors else
                  f"{100 * min(r.span_errors):+.1f} % to {100 * max(r.span_errors):+.1f} % "
                  f"({len(r.span_errors)})")
        out.append(
            f"| {run.order} | {run.name} | {run.date} | {run.machine} | {run.jobs} / {run.cpus} "
            f"| {run.peak_gib:.1f} ({run.peak_of}) | {peak} | {model} | {_pct(r.peak_error)} "
            f"| {r.measured_span:.0f} | {span} | {_pct(r.span_error)} | {spread} |")
    return out


def summary(rows: Sequence[Row]) -> list[str]:
    out_span = [r.span_error for r in rows if r.span_error is not None]
    every = [e for r in rows for e in r.span_errors]
    lines = []
    for model in ("per-object", "per-job"):
        errors = [r.peak_error for r in rows if r.peak_error is not None and not r.in_sample
                  and r.peak_model.startswith(model)]
        if errors:
            lines.append(f"- peak by the {model} model, out of sample ({len(errors)} runs): "
                         f"{100 * min(errors):+.1f} % to {100 * max(errors):+.1f} %")
    if out_span:
        lines.append(f"- compile time, the planner's choice of earlier times ({len(out_span)} "
                     f"runs): {100 * min(out_span):+.1f} % to {100 * max(out_span):+.1f} %")
    if every:
        lines.append(f"- compile time, every (run, candidate earlier run) pair ({len(every)}): "
                     f"{100 * min(every):+.1f} % to {100 * max(every):+.1f} %")
    return lines


def sampled_table(runs: Sequence[Run]) -> list[str]:
    """Every run replayed with the per-object peaks the sampler measured (each object's own
    largest RSS, as every build now records them) against the fitted ones: the replay's
    coincidence rule (each object at its peak for its first 60 s) with true per-object maxima.
    The sampled peaks come from one run (#5): a ratio for that run is in-sample."""
    sampled = {k: v for r in runs for k, v in r.object_peaks.items() if r.archs == (90,)}
    source = next((r.order for r in runs if r.object_peaks and r.archs == (90,)), None)
    if not sampled or source is None:
        return []
    fitted = fit()
    out = [f"| # | run | measured GiB | replayed, fitted peaks | replayed, sm_90 peaks sampled in #"
           f"{source} | measured / replayed with sampled peaks |",
           "|---:|---|---:|---:|---:|---:|"]
    for run in sorted(runs, key=lambda r: r.order):
        t, f = alone(run), contention_factor(run.jobs, run.cpus)
        extra = NON_COMPILE_MIB / 1024 if run.peak_of == "host" else 0.0
        got = []
        for peaks in (fitted, sampled):
            heaviest = max(peaks.values())
            objects = [(t[o.key] * f, peaks.get(o.key, heaviest)) for o in run.entries()]
            got.append(replay(objects, run.jobs).peak_bytes / GIB + extra)
        note = " (in-sample)" if run.order == source else ""
        out.append(f"| {run.order} | {run.name} | {run.peak_gib:.1f} | {got[0]:.1f} | "
                   f"{got[1]:.1f} | {run.peak_gib / got[1]:.3f}{note} |")
    return out


def fits_table(history: MemoryHistory) -> list[str]:
    """Every real run under a cap: what happened, and what today's planner says of it (the
    replay as the planner counts it at the run's CPUs: the object times measured nearest them,
    the peaks scaled by the calibration of the record's runs, one object never below its own
    peak). A run whose own figures are in that model is marked in-sample, with which."""
    from factory.matrix.cell import Cell
    from factory.planning.planner import ObjectReplay, calibration

    beside = history.non_compile_bytes("flash-attn")
    out = ["| run | cap GiB | jobs | what happened | today's model: peak GiB | says | right? |",
           "|---|---:|---:|---|---:|---|---|"]
    cases = [  # run 2 of the table above, one of the two the sm_90 peaks were fitted on
        ("sm_90 16 jobs (first GPU run, naive)", (90,), 64, 16, 16, "built; 56.25 GiB used"),
        ("sm_90 16 jobs (second GPU run, naive)", (90,), 48, 16, 16,
         "OOM-killed after 41 s"),
        ("sm_90 9 jobs (planner)", (90,), 48, 9, 16, "built; compilers 36.9 GiB"),
        ("sm_100 9 jobs (planner)", (100,), 48, 9, 16, "built; compilers 34.8 GiB"),
        ("sm_90 32 jobs (planner)", (90,), 160, 32, 32, "built; compilers 116.4 GiB"),
        ("sm_100 1 job, torch 2.14.1 (this builder, docker)", (100,), 7, 1, 1,
         "OOM-killed on flash_bwd_hdim256"),
    ]
    built_here = {}  # the builds on this builder: their dates (the shipped record is one's)
    for row in _flagship():
        name = f"sm_100 {row.jobs} jobs, torch 2.14.1 (this builder, docker, {row.date})"
        built_here[name] = row.date
        cases.append((name, (100,), 16, row.jobs, row.cpus,
                      f"built; compilers {row.peak_gib:.1f} GiB"))
    for name, archs, cap, jobs, cpus, happened in cases:
        cell = Cell(package="flash-attn", version="2.8.3.post2", torch="2.14.1", cuda="13.0",
                    archs=archs, python="3.11")
        times = history.object_times(cell, cpus=cpus)  # as the planner reads them there
        cal = calibration(cell, history, cpus=cpus, model_key="flash-attn")
        objects = ObjectReplay.of(cell, times, 1, peak_factor=cal.peak_factor)
        if objects is not None:
            r = objects.run(jobs, threads=1, archs=1, cpus=cpus)
            gib = (objects.peak(r) + beside) / GIB
            alone = objects.peak(r) > int(r.peak_bytes * cal.peak_factor)
            how = ("replay" if cal.peak_factor == 1 else
                   "replay, one object at its own peak" if alone else
                   f"replay x {cal.peak_factor:.3f}")
        else:
            from factory.planning.memory_model import ModelKey
            from factory.planning.planner import predicted_peak

            est = history.estimate(ModelKey.for_cell(cell, 1), model_key="flash-attn")
            gib = predicted_peak(jobs, per_job=est.per_job_bytes, largest=est.largest,
                                 headroom=history.headroom_bytes("flash-attn")) / GIB
            how = "per-job"
        says = "OOM" if gib > cap else "fits"
        oom = "OOM" in happened
        right = "yes" if (says == "OOM") == oom else "**no**"
        same = [r for r in (times.runs if times and objects else ())
                if r.peak_bytes and (r.max_jobs, r.cpus) == (jobs, cpus)]
        # a build of this builder: its own record by date (the flagship was built here twice)
        own = (next((r for r in same if r.date == built_here[name]), None)
               if name in built_here else same[-1] if same else None)
        inputs = [what for what, yes in (
            ("its object times", own is not None and own.supplied_times),
            # the shipped per-object peaks are the flagship builds' (each object's larger)
            ("its per-object peaks", own is not None and name in built_here),
            ("its peak (the calibration)", own is not None and cal.peak_factor < 1),
            ("its peak (the sm_90 peaks' fit)", archs == (90,) and (jobs, cap) == (16, 64)),
        ) if yes]
        if inputs:
            right += f" (in-sample: {', '.join(inputs)})"
        out.append(f"| {name} | {cap} | {jobs} | {happened} | {gib:.2f} ({how}) | {says} "
                   f"| {right} |")
    return out


def history_runs(runs: Sequence[Run]) -> dict[str, list[dict[str, object]]]:
    """The runs built in the factory's order as RecordedRun records, per arch set ("90")."""
    from factory.planning.object_times import RecordedRun

    out: dict[str, list[dict[str, object]]] = {}
    for run in sorted(runs, key=lambda r: r.order):
        if not run.factory_order:
            continue
        rec = RecordedRun(source=run.name, date=run.date, max_jobs=run.jobs, cpus=run.cpus,
                          compile_seconds=round(run.span(), 1),
                          peak_bytes=int(run.peak_gib * GIB), peak_of=run.peak_of,
                          machine=run.machine, order=tuple(o.key for o in run.entries()),
                          seconds={k: round(v, 3) for k, v in run.seconds().items()})
        out.setdefault("+".join(map(str, run.archs)), []).append(rec.as_dict())
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="print the fitted per-object peaks")
    ap.add_argument("--history-runs", action="store_true",
                    help="print the runs as the memory history's records (JSON)")
    args = ap.parse_args(argv)
    if args.fit:
        for k, v in fit().items():
            print(f"{k}\t{v}")
        return 0
    if args.history_runs:
        print(json.dumps(history_runs(RUNS), indent=1))
        return 0
    rows = predict(RUNS)
    print("\n".join(table(rows)))
    print()
    print("\n".join(summary(rows)))
    print()
    print("\n".join(fits_table(MemoryHistory.load(shipped_history_path()))))
    print()
    print("\n".join(sampled_table(RUNS)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
