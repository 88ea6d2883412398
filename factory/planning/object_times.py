"""What a recorded build says of its objects: each object's compile seconds and peak, the
conditions they were measured under, and the whole runs of the same objects (``RecordedRun``:
jobs, CPUs, the compile's span and peak, the machine), from which a plan takes the times of
the machine nearest its own (``nearest_times``), its speed and its ranges
(factory.planning.spread). Kept in the memory history (factory.planning.memory_model)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from factory.planning.replay import contention_factor

PEAK_OF = ("compilers", "host")  # what a run's peak counts (RecordedRun.peak_of)
# below this share of their wall time on a CPU, a run's compilers were starved by other work
# (the first flagship build: 0.46; its idle rebuild 0.94): nearest_times passes its times over
MIN_ON_CPU = 0.75


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordedRun:
    """One real build of an objects entry, as a whole: its conditions and what it measured.

    ``peak_of``: "compilers" is the summed RSS of the compiler processes at their peak (the
    runners' sampler); "host" is the host's used memory above idle, which also holds setup.py
    and ninja (the GPU machine's 2-s samples)."""

    source: str
    date: str
    max_jobs: int
    cpus: int
    compile_seconds: float  # ninja's span: first start to last end
    peak_bytes: int | None = None
    peak_of: str = "compilers"
    machine: str = ""  # the builder's CPU model and count, where recorded
    # the objects in the order the run started them (a plan's check replays it in that order:
    # a later build's order, from newer times, is not the one this run's peak came from)
    order: tuple[str, ...] = ()
    # the entry's per-object seconds are this run's own: the model replays it exactly, so it
    # is no evidence of how far the model is off (factory.planning.spread)
    supplied_times: bool = False
    # this run's own per-object seconds, kept when a later build's became the entry's: a plan
    # for a machine like this run's takes them (MemoryHistory.object_times)
    seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # CPU seconds the build used while its compilers ran (the runners' sampler; for a run
    # measured outside the factory, its container's); None: not measured
    cpu_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["order"] = list(self.order)
        out["seconds"] = dict(sorted(self.seconds.items()))
        for key in ("supplied_times", "seconds", "cpu_seconds"):  # absent where unset
            if not out[key]:
                del out[key]
        return out

    def on_cpu(self, seconds: Mapping[str, float] | None = None, per_job: int = 1
               ) -> float | None:
        """How much of its objects' wall time its compilers had a CPU: its CPU seconds over
        the objects' seconds (``seconds``, this run's; default its kept ones, else its span x
        its jobs) x compilers per job; None unmeasured. An idle builder gives about 0.94 (the
        flagship rebuild), one shared with other work less (the first flagship build: 0.46,
        every object about 2x its idle time)."""
        wall = (sum(seconds.values()) if seconds is not None else sum(self.seconds.values())
                if self.seconds else self.compile_seconds * self.max_jobs)
        work = wall * max(1, per_job)
        if self.cpu_seconds is None or work <= 0:
            return None
        return self.cpu_seconds / work

    def starved(self, seconds: Mapping[str, float] | None = None, per_job: int = 1) -> bool:
        """Whether other work took the CPUs from its compilers (on_cpu below MIN_ON_CPU): its
        times say how loaded the builder was, not how fast the machine is."""
        share = self.on_cpu(seconds, per_job)
        return share is not None and share < MIN_ON_CPU

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecordedRun:
        peak_of = str(d.get("peak_of", "compilers"))
        if peak_of not in PEAK_OF:
            raise ValueError(f"peak_of {peak_of!r} is not one of {PEAK_OF}")
        peak = d.get("peak_bytes")
        return cls(source=str(d.get("source", "")), date=str(d.get("date", "")),
                   max_jobs=int(d["max_jobs"]), cpus=int(d["cpus"]),
                   compile_seconds=float(d["compile_seconds"]),
                   peak_bytes=int(peak) if peak is not None else None, peak_of=peak_of,
                   machine=str(d.get("machine", "")),
                   order=tuple(str(k) for k in d.get("order", ())),
                   supplied_times=bool(d.get("supplied_times", False)),
                   seconds={str(k): float(v) for k, v in d.get("seconds", {}).items()},
                   cpu_seconds=(float(d["cpu_seconds"]) if d.get("cpu_seconds") is not None
                                else None))

    def describe(self) -> str:
        return (f"{self.date or 'undated'} {self.max_jobs} job(s) on {self.cpus} CPU(s)"
                + (f" ({self.machine})" if self.machine else ""))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ObjectTimes:
    """Per-object compile seconds from one build, the conditions they were measured in, and
    the whole runs recorded for the same objects."""

    package: str
    version: str
    cuda: str
    archs: tuple[int, ...]
    nvcc_threads: int
    seconds: Mapping[str, float]  # object key (see object_key) -> seconds
    source: str
    # object key -> its peak RSS (nvcc and its children), measured at ``nvcc_threads``
    peaks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # the conditions the seconds were measured under (their contention, see replay.py);
    # 0: unknown, taken as uncontended
    max_jobs: int = 0
    cpus: int = 0
    runs: tuple[RecordedRun, ...] = ()  # oldest first
    peaks_from: str = ""  # where the per-object peaks come from, in words
    # OOM kills that raised these peaks (record_oom): a kill proves the replay was not too
    # high there, so no run's ratio scales the peaks down (planning.spread.calibrate)
    ooms: int = 0
    # object key -> the ninja run it compiles in, where that is not the first: setup.py runs
    # ninja once per extension, and a run starts when the one before it has ended
    # (torch-scatter: 8 runs of 2-3 objects); absent for a build of one run
    stages: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """Which record: "flash-attn 2.8.3.post2, CUDA 13.0, sm_100"."""
        archs = "+".join(f"sm_{a}" for a in self.archs)
        return f"{self.package} {self.version}, CUDA {self.cuda}, {archs}"

    def per_arch_rounds(self) -> int:
        """How many sequential arch rounds each measured compile ran."""
        return math.ceil(len(self.archs) / min(self.nvcc_threads, len(self.archs)))

    def scaled(self, archs: int, nvcc_threads: int) -> dict[str, float]:
        """Seconds per object for a build of ``archs`` archs at ``nvcc_threads`` threads.

        The device compile (cicc + ptxas) dominates and runs once per arch, min(threads,
        archs) at a time, so a file's time scales with the number of rounds.
        """
        rounds = math.ceil(archs / min(max(1, nvcc_threads), archs))
        factor = rounds / self.per_arch_rounds()
        return {k: v * factor for k, v in self.seconds.items()}

    def alone(self) -> dict[str, float]:
        """Seconds per object with nothing else compiling (the measured contention removed)."""
        if not self.max_jobs or not self.cpus:
            return dict(self.seconds)
        conc = min(self.nvcc_threads, len(self.archs))
        factor = contention_factor(self.max_jobs * conc, self.cpus)
        return {k: v / factor for k, v in self.seconds.items()}

    def scaled_peaks(self, concurrent_archs: int) -> dict[str, int]:
        """Peak bytes per object at ``concurrent_archs`` archs compiled at once (each arch a
        compiler of about the same size, as in the per-job model)."""
        measured = min(self.nvcc_threads, len(self.archs))
        return {k: int(v * concurrent_archs / measured) for k, v in self.peaks.items()}



def nearest_times(times: ObjectTimes, cpus: int) -> ObjectTimes:
    """The times measured nearest ``cpus`` CPUs: the entry's own, or a recorded run's that
    kept its own (RecordedRun.seconds) and ran on a CPU count strictly nearer (ratio of the
    counts; the most recent of equals). Why: the object times of one build on the shared
    2-core builder are off by 0.2-4.5x per object against an H200 run's (its load changed over
    its two hours), and no single speed factor mends that; a build on a machine like the
    plan's is the best evidence of how its objects compare (docs/BENCHMARKS.md).

    Except a run whose compilers had a CPU less than MIN_ON_CPU of their wall time
    (RecordedRun.on_cpu: the builder was shared with other work, and its load inflated its
    objects unevenly): its times are taken only where no run measured otherwise kept its own."""
    def distance(c: int) -> float:
        return abs(math.log(c / cpus)) if c > 0 else math.inf

    per_job = min(times.nvcc_threads, len(times.archs))
    supplied = [r for r in times.runs if r.supplied_times]
    own = min([distance(times.cpus)] + [distance(r.cpus) for r in supplied])
    kept = [(i, r) for i, r in enumerate(times.runs) if r.seconds and not r.supplied_times
            and not r.starved(per_job=per_job)]
    if not kept:
        return times
    i, best = min(kept, key=lambda ir: (distance(ir[1].cpus), -ir[0]))
    if distance(best.cpus) >= own and not any(
            r.starved(times.seconds, per_job) for r in supplied):
        return times
    runs = tuple(dataclasses.replace(r, supplied_times=j == i) for j, r in enumerate(times.runs))
    return dataclasses.replace(
        times, seconds=dict(best.seconds), max_jobs=best.max_jobs, cpus=best.cpus,
        source=f"{best.source}, {best.date} ({best.machine or 'machine not recorded'})",
        runs=runs)
