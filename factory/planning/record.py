"""What one finished build attempt adds to the memory history: its per-job peak, each object's
seconds and peak, and the attempt as a whole run (its span and peak, the jobs and CPUs it
had, the machine) from which later plans take their ranges."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from factory.errors import FactoryError
from factory.matrix.load import PlannedCell
from factory.planning.history_file import today
from factory.planning.memory_model import BuildMeasurement, MemoryHistory
from factory.planning.ninja_log import (
    ObjectNames,
    base_key,
    compile_span,
    object_key,
    read_entries,
    stages_of,
)
from factory.planning.object_times import RecordedRun
from factory.units import format_size


class CompileMeasurements(Protocol):
    """What record_build reads from a runner's result (factory.runners.base.RunResult)."""

    @property
    def oom_killed(self) -> bool: ...
    @property
    def compile_peak_rss_bytes(self) -> int | None:
        """Peak of the summed RSS of all compiler processes."""
    @property
    def max_concurrent_compiles(self) -> int | None:
        """Most compile jobs alive at one sample."""
    @property
    def cache_hits(self) -> int | None: ...
    @property
    def sccache_hits(self) -> int | None: ...
    @property
    def compile_cpu_seconds(self) -> float | None:
        """CPU seconds the build used while compilers ran."""
    @property
    def objects_built(self) -> int | None:
        """Objects compiled in this attempt (ninja's [N/M] lines)."""
    @property
    def object_peak_rss_bytes(self) -> Mapping[str, int] | None:
        """Output path -> its job's peak RSS."""
    @property
    def log_path(self) -> Path: ...


class PlanShape(Protocol):
    @property
    def max_jobs(self) -> int: ...
    @property
    def nvcc_threads(self) -> int: ...
    @property
    def cpus(self) -> int: ...


def machine() -> str:
    """This builder's CPU model and CPU count, as a run record names its machine."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    count = os.cpu_count() or 0
    return ", ".join(x for x in (model, f"{count} CPUs" if count else "") if x)


def object_peaks(raw: Mapping[str, int], objects: Iterable[str]) -> dict[str, int]:
    """The sampler's peaks (by each compile process's ``-o``) -> the peak of each of
    ``objects`` (object keys, from ninja's log).

    Without a compile cache a job's -o is its object. Through the cache (sccache runs nvcc's
    stages in its server, each with an -o in a temp dir named after the source:
    ``/tmp/sccache_nvccXXXX/<name>.ptx`` for cicc, ``.cubin`` for ptxas) an object's peak is
    its largest stage, matched by the source's name where that name is one object's alone.
    Anything else is left out: the link (.so), a host compile's temporary ``cc*.s``, the
    anonymous ``x_0.cpp1.ii`` stages."""
    wanted = set(objects)
    names = ObjectNames(wanted)
    out: dict[str, int] = {}
    for path, value in raw.items():
        key: str | None = object_key(path)
        if key not in wanted:
            key = names.of(path)
            if key is None:
                continue
        out[key] = max(int(value), out.get(key, 0))
    # an output compiled again (``<key>#<n>``) was sampled under its one -o: each compile of
    # it counts at that peak
    for key in wanted:
        if key not in out and base_key(key) in out:
            out[key] = out[base_key(key)]
    return out


def record_build(pc: PlannedCell, plan: PlanShape, result: CompileMeasurements, *,
                 build_tree: Path | None = None, history: MemoryHistory | None = None,
                 share: Callable[[BuildMeasurement], None] | None = None) -> str:
    """Fold one finished attempt into the history; returns a line for the build log.

    Per-job peak: the compilers' peak summed RSS over the most jobs seen at once (a peak of
    the sum, like the shipped 16-job figure). Object times: the build tree's .ninja_log, which
    after an OOM resume holds every attempt's objects; skipped when a compile cache answered
    (hits are not compile times). The run as a whole (span, peak) only when this attempt
    compiled every object of the log: a resumed attempt's span is not a build's. An
    OOM-killed attempt is recorded by plan_after_oom instead. A history that cannot be
    written is reported, never fatal: the wheel matters more.
    """
    if result.oom_killed:
        return "memory history: OOM attempt (recorded by the re-plan)"
    peak = result.compile_peak_rss_bytes
    jobs = result.max_concurrent_compiles
    per_job = peak // jobs if peak and jobs else None
    if not result.objects_built:
        # a resumed build with every object already there only links: its small peak says
        # nothing about a compile job, and would drag the model down
        per_job = None
    # build.py keeps the tree in <work>/src and logs in <work>/logs/attempt-N.log.
    tree = build_tree if build_tree is not None else result.log_path.parent.parent / "src"
    seconds: dict[str, float] = {}
    stages: dict[str, int] = {}
    run = None
    cached = bool(result.cache_hits or result.sccache_hits)
    if not cached:  # any hit: not compile times
        logs = sorted(tree.glob("build/temp*/.ninja_log"))
        # one log: this attempt's compiles are its last objects_built entries
        entries = [e for log in logs for e in read_entries(
            log, compiled=result.objects_built if len(logs) == 1 else None)]
        seconds = {e.key: e.seconds for e in entries}
        stages = stages_of(entries)
        if entries and result.objects_built == len(seconds):
            run = RecordedRun(
                source=f"factory build {pc.cell.id}", date=today(), max_jobs=plan.max_jobs,
                cpus=plan.cpus, compile_seconds=round(compile_span(entries), 1),
                peak_bytes=peak, peak_of="compilers", machine=machine(),
                cpu_seconds=result.compile_cpu_seconds,
                order=tuple(e.key for e in sorted(entries, key=lambda e: e.start)))
    # A cache hit's process is small: only a compile's peak says what the object needs.
    raw = {} if cached else dict(result.object_peak_rss_bytes or {})
    peaks = object_peaks(raw, seconds) if seconds else {
        object_key(path): int(v) for path, v in raw.items()}
    if per_job is None and not seconds and not peaks:
        return "memory history: nothing measured"
    history = history if history is not None else MemoryHistory.load()
    measurement = BuildMeasurement(
        cell=pc.cell, nvcc_threads=plan.nvcc_threads, max_jobs=plan.max_jobs,
        peak_job_bytes=per_job, object_seconds=seconds, object_peaks=peaks, cpus=plan.cpus,
        object_stages=stages,
        source=f"factory build {today()}, {plan.max_jobs} job(s) x {plan.nvcc_threads} "
        "thread(s): peak compiler RSS / most jobs at once", run=run,
    )
    try:
        history.record(measurement)
        if share is not None:
            share(measurement)  # other builders merge it (factory.planning.shared_history)
    except FactoryError as exc:
        return f"memory history: not recorded ({exc.message})"
    got = f"{format_size(per_job)} per job" if per_job else "no memory figure"
    return (f"memory history {history.path}: {got}, {len(seconds)} object time(s), "
            f"{len(peaks)} object peak(s)" + (", the run as a whole" if run else ""))
