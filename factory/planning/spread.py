"""How far a plan's figures have been off: a range from the recorded runs the plan drew on.

Each objects entry of the memory history keeps the real runs its figures come from
(memory_model.RecordedRun: the jobs and CPUs a build had, its measured compile span and peak).
For each of them the planner's own model is replayed at that run's jobs and CPUs; measured /
replayed is how far the model was off there: the machine's speed (object times of one machine
kind differ by 14 % between two VMs) and the model's own error together. A plan's point figure
times the least and the most of those ratios, and 1 (the point is always inside), is its
range; the point stays what the planner chose by.

Where fewer than two runs measured the compile time, its range is widened by MACHINE_SPREAD
on both sides: one run says how fast one machine was, not the next. Memory does not depend on
a machine's speed, so a peak range is never widened; where no run measured a peak, the peak's
range comes from the per-job record's recent peaks (the planner passes it) or is the point.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from factory.planning.memory_model import RecordedRun
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
        }

    def describe(self) -> str:
        out = (f"{self.run.describe()}: compile measured {self.run.compile_seconds:.0f} s, "
               f"the model at its jobs and CPUs {self.predicted_seconds:.0f} s")
        if self.peak_ratio is not None and self.run.peak_bytes and self.predicted_peak_bytes:
            out += (f"; peak ({self.run.peak_of}) measured {format_size(self.run.peak_bytes)}, "
                    f"the model {format_size(self.predicted_peak_bytes)}")
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spread:
    seconds: tuple[float, float] | None  # None: the plan predicts no time
    peak: tuple[int, int]
    checks: tuple[RunCheck, ...]
    seconds_widened: bool  # fewer than two runs measured the time: MACHINE_SPREAD added
    peak_source: str  # where the peak's range comes from, in words

    def reasons(self) -> list[str]:
        out = []
        if self.seconds is not None:
            lo, hi = self.seconds
            how = (f"from {self._count('seconds')} recorded run(s)"
                   + (f", widened by the {MACHINE_SPREAD:.0%} measured between two VMs of one "
                      "machine kind (fewer than two runs)" if self.seconds_widened else ""))
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
    p_ratios = [r for c in checks if (r := c.peak_ratio) is not None]
    seconds = None
    widened = False
    if point_seconds is not None:
        lo, hi = min([1.0, *s_ratios]), max([1.0, *s_ratios])
        if len(s_ratios) < 2:
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
