"""What the recorded runs say about a plan: the machine speed and peak factor it is scaled by,
and a range around its figures.

Each objects entry of the memory history keeps the real runs its figures come from
(object_times.RecordedRun: the jobs and CPUs a build had, its measured compile span and peak).
For each of them the planner's own model is replayed at that run's jobs and CPUs; measured /
replayed is how far the model was off there: the machine's speed (object times of one machine
kind differ by 14 % between two VMs) and the model's own error together.

``calibrate`` turns those ratios into the plan's scale:

- Speed. A record's per-object seconds are one machine's. A plan for N CPUs takes the object
  times measured nearest N CPUs (object_times.nearest_times: the record's own, or a recorded
  run's that kept its own); where a recorded run without times of its own ran nearer still,
  the plan takes that run's speed, its measured / replayed ratio. Evidence: the sm_100 times of
  the flagship build on the shared 2-core builder, replayed at 9 jobs on 16 CPUs, give 1623 s
  where the H200 VM measured 1029 s (and they are off by 0.2-4.5x per object: its load changed
  over its two hours); the other way, the H200 times give the 2-core build -35 %. A run on as
  many CPUs is the best evidence of the next such machine; the CPU count is what a plan knows
  of the machine it plans for. A run whose compilers had a CPU less than 3/4 of their time
  (object_times.MIN_ON_CPU: a builder shared with other work) gives neither times nor speed
  where another run can.
- Peak. The per-object peaks are each object's own largest RSS, and the replay holds every
  object at that peak for its first minute: every recorded run measured less than that replay
  (0.78-0.93 in docs/BENCHMARKS.md). The replayed peak is scaled by the HIGHEST measured /
  replayed ratio of the entry's runs (never above 1), so the plan is as bold as the least
  favourable run allows, no bolder; one object alone is never scaled (a single compile does
  reach its own peak: the 7 GiB flagship attempt was OOM-killed on one object). After an OOM
  kill raised the peaks (memory_model.record_oom) they are not scaled down at all.

A plan's point figure times the least and the most of the ratios (against the scaled model),
and 1 (the point is always inside), is its range; the point stays what the planner chose by.
A run that supplied the point (its object times, or the speed) is replayed at ratio 1 by
construction, so it is shown but not counted: where fewer than two OTHER runs measured the
compile time, its range is widened by MACHINE_SPREAD on both sides (one run says how fast one
machine was, not the next). Memory does not depend on a machine's speed, so a peak range is
never widened; where no run measured a peak, the peak's range comes from the per-job record's
recent peaks (the planner passes it) or is the point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from factory.planning.object_times import RecordedRun
from factory.units import format_size

# Object times of the same build on two VMs of one machine kind (the two 16-job sm_90 H200
# logs in the repo: sums 16 212 s and 18 428 s of the same 73 objects) differ by 14 %.
MACHINE_SPREAD = 0.14


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunCheck:
    """One recorded run against the model replayed at its jobs and CPUs."""

    run: RecordedRun
    predicted_seconds: float
    predicted_peak_bytes: int | None = None  # None: not replayed (the run has no peak)
    supplied: str = ""  # what of the point this run supplied ("object times", "speed"): no evidence

    @property
    def seconds_ratio(self) -> float | None:
        if self.predicted_seconds <= 0 or self.run.compile_seconds <= 0:
            return None
        return self.run.compile_seconds / self.predicted_seconds

    @property
    def peak_ratio(self) -> float | None:
        if not self.predicted_peak_bytes or not self.run.peak_bytes:
            return None
        return self.run.peak_bytes / self.predicted_peak_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.run.as_dict(),
            "predicted_compile_seconds": round(self.predicted_seconds, 1),
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "supplied": self.supplied or None,
        }

    def describe(self) -> str:
        out = (f"{self.run.describe()}: compile measured {self.run.compile_seconds:.0f} s, "
               f"the model at its jobs and CPUs {self.predicted_seconds:.0f} s")
        if self.peak_ratio is not None and self.run.peak_bytes and self.predicted_peak_bytes:
            out += (f"; peak ({self.run.peak_of}) measured {format_size(self.run.peak_bytes)}, "
                    f"the model {format_size(self.predicted_peak_bytes)}")
        if self.supplied:
            out += f" (it supplied the point's {self.supplied}: not counted as evidence)"
        return out

    def scaled(self, speed: float, peak: int | None) -> RunCheck:
        """The same run against the model at ``speed`` and with the peak ``peak``."""
        return dataclasses.replace(self, predicted_seconds=self.predicted_seconds * speed,
                                   predicted_peak_bytes=peak)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """How a plan's model is scaled by the recorded runs (see the module's docstring)."""

    speed: float = 1.0  # the plan's seconds = the model's x speed
    speed_from: RecordedRun | None = None  # None: the object times' own machine
    peak_factor: float = 1.0  # the replayed peak (above one object alone) x this
    peak_runs: int = 0  # the runs the factor is the highest ratio of

    def reasons(self, cpus: int) -> list[str]:
        out = []
        if self.speed_from is not None:
            out.append(f"object times at the speed of the recorded run nearest {cpus} CPU(s): "
                       f"{self.speed_from.describe()} compiled in {self.speed:.2f}x the time the "
                       "object times give at its jobs and CPUs")
        if self.peak_factor < 1.0:
            out.append(f"replayed peaks x {self.peak_factor:.3f}: the highest measured / "
                       f"replayed ratio of the {self.peak_runs} recorded run(s) (one object "
                       "alone at its full peak)")
        return out


def calibrate(checks: Sequence[RunCheck], *, times_cpus: int, cpus: int,
              ooms: int = 0) -> Calibration:
    """The speed and peak factor for a plan on ``cpus`` CPUs from the runs' checks against the
    unscaled model; ``times_cpus``: the CPUs the object times were measured on (0: unknown);
    ``ooms``: OOM kills that raised the peaks (each one a run above the replay: no factor)."""
    def distance(run_cpus: int) -> float:
        return abs(math.log(run_cpus / cpus))

    speed, speed_from = 1.0, None
    # a run whose compilers were starved by other work (RecordedRun.starved) measured the load
    timed = [(i, c) for i, c in enumerate(checks)
             if c.seconds_ratio is not None and c.run.cpus > 0 and not c.run.supplied_times
             and not c.run.starved()]
    if timed and cpus > 0:
        i, best = min(timed, key=lambda ic: (distance(ic[1].run.cpus), -ic[0]))
        own = min(([distance(times_cpus)] if times_cpus > 0 else [])
                  + [distance(c.run.cpus) for c in checks if c.run.supplied_times and c.run.cpus],
                  default=math.inf)
        if distance(best.run.cpus) < own:
            speed, speed_from = best.seconds_ratio or 1.0, best.run
    peaks = [r for c in checks if (r := c.peak_ratio) is not None] + [1.0] * ooms
    return Calibration(speed=speed, speed_from=speed_from,
                       peak_factor=min(1.0, max(peaks)) if peaks else 1.0,
                       peak_runs=len(peaks))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spread:
    seconds: tuple[float, float] | None  # None: the plan predicts no time
    peak: tuple[int, int]
    checks: tuple[RunCheck, ...]
    seconds_widened: bool  # fewer than two other runs measured the time: MACHINE_SPREAD added
    peak_source: str  # where the peak's range comes from, in words

    def reasons(self) -> list[str]:
        out = []
        if self.seconds is not None:
            lo, hi = self.seconds
            timed = self._count("seconds")
            others = sum(1 for c in self.checks if c.seconds_ratio is not None and not c.supplied)
            how = (f"from {timed} recorded run(s)"
                   + (f", {others} of them other than the point's own" if others < timed else "")
                   + (f", widened by the {MACHINE_SPREAD:.0%} measured between two VMs of one "
                      "machine kind (fewer than two other runs)" if self.seconds_widened
                      else ""))
            out.append(f"predicted compile time range {lo / 60:.0f}-{hi / 60:.0f} min ({how})")
        lo_b, hi_b = self.peak
        out.append(f"predicted peak range {format_size(lo_b)}-{format_size(hi_b)} "
                   f"({self.peak_source})")
        out += [f"recorded run {c.describe()}" for c in self.checks]
        return out

    def _count(self, what: str) -> int:
        attr = "seconds_ratio" if what == "seconds" else "peak_ratio"
        return sum(1 for c in self.checks if getattr(c, attr) is not None)


def spread(point_seconds: float | None, point_peak: int, checks: Sequence[RunCheck], *,
           peak_fallback: tuple[int, int] | None = None,
           peak_fallback_source: str = "") -> Spread:
    """The ranges around a plan's point figures (see the module's docstring)."""
    s_ratios = [r for c in checks if (r := c.seconds_ratio) is not None]
    evidence = [c for c in checks if c.seconds_ratio is not None and not c.supplied]
    p_ratios = [r for c in checks if (r := c.peak_ratio) is not None]
    seconds = None
    widened = False
    if point_seconds is not None:
        lo, hi = min([1.0, *s_ratios]), max([1.0, *s_ratios])
        if len(evidence) < 2:
            lo, hi, widened = lo / (1 + MACHINE_SPREAD), hi * (1 + MACHINE_SPREAD), True
        seconds = (round(point_seconds * lo, 1), round(point_seconds * hi, 1))
    if p_ratios:
        peak = (int(point_peak * min([1.0, *p_ratios])), int(point_peak * max([1.0, *p_ratios])))
        source = f"from {len(p_ratios)} recorded run(s)"
    elif peak_fallback is not None:
        peak = (min(peak_fallback[0], point_peak), max(peak_fallback[1], point_peak))
        source = peak_fallback_source
    else:
        peak, source = (point_peak, point_peak), "no recorded run measured it: the point alone"
    return Spread(seconds=seconds, peak=peak, checks=tuple(checks), seconds_widened=widened,
                  peak_source=source)
