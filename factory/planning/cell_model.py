"""One cell's time, the one model `factory plan` and `factory schedule` share.

A cell is its compile and the work around it:

- the compile is the planner's plan at a memory and CPU share (factory.planning.planner): its
  predicted span alone on those CPUs (the per-object replay or the list schedule of the object
  times, contention included, at the plan's machine speed) and the CPU-seconds its objects
  take at that plan (each object's planned duration x the archs it compiles at once). A
  schedule that runs cells side by side shares CPUs out by that work, and a cell alone on its
  CPUs takes exactly the planner's span.
- the overhead is everything of a `factory build` that is not the compile (the build venv and
  pip before ninja, the link, tag, repair and verify after), as measured in real runs (whole
  build minus ninja's span): the history's ``cell_overhead`` for the recipe, whose median is
  used; CELL_OVERHEAD_SECONDS where none was measured.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Protocol

from factory.matrix.cell import Cell
from factory.planning.memory_model import MemoryHistory
from factory.planning.record import PlanShape
from factory.planning.replay import contention_factor

# Where no run measured a recipe's overhead: flash-attn's resumed link-only build of 2026-11-29
# (setup.py, link, tag, repair, verify) on the H200 machine.
CELL_OVERHEAD_SECONDS = 79.0
UNKNOWN_COMPILE_SECONDS = 600.0  # a package with no object times in the history


class PlanFigures(PlanShape, Protocol):
    """What a cell's time reads from a plan (factory.planning.planner.BuildPlan, which imports
    this module)."""

    @property
    def predicted_seconds(self) -> float | None: ...
    @property
    def speed_factor(self) -> float:
        """The plan's machine speed on the object times (planning.spread.calibrate)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellTime:
    compile_seconds: float  # the planner's predicted span, alone on the plan's CPUs
    cpu_seconds: float  # the compile's CPU-seconds at the plan
    parallel: int  # compilers at once at most: jobs x archs compiled at once
    overhead_seconds: float
    overhead_source: str

    @property
    def seconds(self) -> float:
        return self.compile_seconds + self.overhead_seconds


def overhead_of(history: MemoryHistory, model_key: str) -> tuple[float, str]:
    """The recipe's measured per-cell overhead (the median of its runs) and where it is from."""
    found = history.default(model_key)
    runs: list[Any] = list(found[1].get("cell_overhead", [])) if found else []
    seconds = [float(r["seconds"]) for r in runs if isinstance(r, dict) and "seconds" in r]
    if not seconds:
        return CELL_OVERHEAD_SECONDS, (f"{CELL_OVERHEAD_SECONDS:.0f} s: no run of this recipe "
                                       "measured it (flash-attn's link-only resume)")
    return statistics.median(seconds), (
        f"the median of {len(seconds)} measured run(s) ({min(seconds):.0f}-{max(seconds):.0f} s, "
        "whole build minus compile)")


def cell_time(cell: Cell, plan: PlanFigures, history: MemoryHistory, *,
              model_key: str, machine_cpus: int | None = None) -> CellTime:
    """The cell under ``plan``: the planner's compile span and its CPU-seconds, the overhead;
    the object times the plan's (those measured nearest ``machine_cpus``, else its CPUs)."""
    archs = len(cell.archs)
    conc = min(plan.nvcc_threads, archs)
    parallel = plan.max_jobs * conc
    extra, source = overhead_of(history, model_key or cell.package)
    times = history.object_times(cell, cpus=machine_cpus or plan.cpus)
    if times is None or not times.seconds or plan.predicted_seconds is None:
        return CellTime(compile_seconds=UNKNOWN_COMPILE_SECONDS,
                        cpu_seconds=UNKNOWN_COMPILE_SECONDS * parallel, parallel=parallel,
                        overhead_seconds=extra, overhead_source=source)
    base = dataclasses.replace(times, seconds=times.alone())
    seconds = base.scaled(archs, plan.nvcc_threads)
    factor = contention_factor(parallel, plan.cpus)
    return CellTime(compile_seconds=plan.predicted_seconds,
                    cpu_seconds=sum(seconds.values()) * factor * conc * plan.speed_factor,
                    parallel=parallel,
                    overhead_seconds=extra, overhead_source=source)
