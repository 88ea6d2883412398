"""The work model every engine reads: the missing cells in groups of shared kernels, longest
first, each with what one allocation for it needs.

A group (``groups.group_cells``: one package, version, torch, CUDA, arch set and platform, any
Python) runs whole in one allocation, its cells in order, so the later ones take the first
one's kernels from the compile cache. For the largest allocation an engine may give a job
(``memory`` and ``cpus``: a Slurm node or partition limit, a Kubernetes node size, a queue
worker's own machine), the planner plans the group's first cell; the group then asks for the
CPUs that plan keeps busy (jobs x the archs each compiles at once), or fewer where fewer are
predicted within 5 % of that time (``fewest_cpus``), and the memory of the top of the planner's
peak range (planned lower where that top would not fit the allocation). Inside such an
allocation the planner, reading the allocation's own cgroup limit, makes the same plan: the
CPUs cap the jobs at the same number, and the memory is at least the peak it predicts for them.

Time: the group alone in its allocation as the schedule's cell model runs it
(``cell_times``: the first cell's compile, the cached later ones, the per-cell overhead),
given as a range, and the limit an engine should set (``time_limit_seconds``): the top of the
range plus an allowance for what the model leaves out (a fresh node installs torch into its
venv and unpacks the toolkit before the first compile).

The ranges are the planner's (``BuildPlan.predicted_peak_range`` and
``predicted_seconds_range``, from the recorded runs the plan drew on: planning/spread.py): the
peak's as it gives it, and the group's time as its point times the planner's compile range over
its compile point (the later cells and the overhead run on the same machine). Where a plan has
no range (no recorded object times for the package: no compile time range; a re-plan after an
OOM: neither), the fixed spreads measured against real runs stand in: a peak from 7 % below to
7 % above the prediction (the worst out-of-sample peak error, docs/BENCHMARKS.md "Per-object
memory and time"), a time from 15 % shorter (VMs of one kind differ by 14 %) to 25 % longer (the
prediction was 19.6 % short of a 32-job run it had not seen: real = predicted / 0.804).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Any

from factory.errors import PlanError
from factory.matrix.load import PlannedCell
from factory.planning.cell_times import CellTimes, shared_span
from factory.planning.groups import Group, group_cells
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import BuildPlan, plan_for
from factory.units import format_size

WORK_VERSION = 1
# Where a plan has no range of its own (see the module docstring): its point x these.
PEAK_SPREAD = (0.93, 1.07)
SECONDS_SPREAD = (0.85, 1.25)
PLAN_TRIES = 3  # plans lowered until the top of the peak range fits the allocation
SETUP_ALLOWANCE_SECONDS = 15 * 60.0  # a fresh node: venv with torch, toolkit, sysroot
MEMORY_ROUND = 256 * 2**20  # allocations are asked for in whole 256 MiB
CPU_SLACK = 0.05  # an allocation takes the fewest CPUs within this of the fastest prediction


def plan_group(g: Group, *, memory: int, cpus: int, history: MemoryHistory) -> BuildPlan:
    """The planner's plan for the group's first cell (the one that compiles everything)."""
    pc = g.cells[0]
    return plan_for(pc.cell, supports_threads=pc.recipe.supports_threads(),
                    memory_model_key=pc.recipe.memory_model_key or pc.recipe.name,
                    memory=memory, cpus=cpus, history=history)


def peak_range(plan: BuildPlan) -> tuple[tuple[int, int], bool]:
    """The plan's peak range (the point always inside it), and whether it is the planner's
    (else the point x PEAK_SPREAD)."""
    point = plan.predicted_peak_bytes
    if plan.predicted_peak_range is None:
        return (int(point * PEAK_SPREAD[0]), int(point * PEAK_SPREAD[1])), False
    lo, hi = plan.predicted_peak_range
    return (min(lo, point), max(hi, point)), True


def seconds_factors(plan: BuildPlan) -> tuple[tuple[float, float], bool]:
    """How far below and above its point the planner puts the compile time (its range over
    its point, 1 always inside), and whether that is the planner's (else SECONDS_SPREAD)."""
    point, got = plan.predicted_seconds, plan.predicted_seconds_range
    if got is None or not point:
        return SECONDS_SPREAD, False
    return (min(1.0, got[0] / point), max(1.0, got[1] / point)), True


def plan_within(g: Group, *, memory: int, cpus: int, history: MemoryHistory) -> BuildPlan:
    """The plan for an allocation of at most ``memory``: at ``memory``, lowered (up to
    PLAN_TRIES times) by the ratio of its peak range's top to its point until that top fits."""
    budget = memory
    plan = plan_group(g, memory=budget, cpus=cpus, history=history)
    for _ in range(PLAN_TRIES - 1):
        top = peak_range(plan)[0][1]
        if top <= memory:
            break
        budget = int(budget * plan.predicted_peak_bytes / top)
        plan = plan_group(g, memory=budget, cpus=cpus, history=history)
    return plan


def group_id(g: Group) -> str:
    """A short id of the group's kernels: its key and its recipe's revision (a new revision is
    new work), not its Pythons, so the id stays while some of its cells are published (a
    queue worker's lease, a queued Slurm job's name). Letters and digits only."""
    recipe = g.cells[0].recipe
    text = "\n".join([*g.key, recipe.name, str(recipe.revision)])
    return "g" + hashlib.sha256(text.encode()).hexdigest()[:11]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkGroup:
    """One group as an engine runs it: one allocation, its cells in order."""

    id: str
    name: str
    machine: str  # the CPU: "x86_64" / "aarch64" (a Slurm constraint, a nodeSelector)
    platform: str  # the wheels' platform tag
    cells: tuple[str, ...]  # cell ids, in build order
    content_keys: tuple[str, ...]
    cpus: int  # what the plan keeps busy
    memory_bytes: int  # what to allocate: the high end of the predicted peak, rounded up
    peak_bytes: tuple[int, int]  # predicted peak of its first cell, low and high
    seconds: tuple[float, float]  # predicted time of all its cells in order, low and high
    predicted_seconds: float  # the point between them
    max_jobs: int
    nvcc_threads: int
    # whose ranges: "planner" for both, else what stood in for the planner's (docstring)
    ranges_from: str = "planner"
    group: Group = dataclasses.field(repr=False, compare=False)

    @property
    def time_limit_seconds(self) -> float:
        """The limit to give an engine: the high end plus the setup allowance."""
        return self.seconds[1] + SETUP_ALLOWANCE_SECONDS

    @property
    def planned(self) -> tuple[PlannedCell, ...]:
        return self.group.cells

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "machine": self.machine,
            "platform": self.platform, "cells": list(self.cells),
            "content_keys": list(self.content_keys), "cpus": self.cpus,
            "memory_bytes": self.memory_bytes, "memory": memory_arg(self.memory_bytes),
            "predicted_peak_bytes_range": list(self.peak_bytes),
            "predicted_seconds": round(self.predicted_seconds, 1),
            "predicted_seconds_range": [round(s, 1) for s in self.seconds],
            "time_limit_seconds": round(self.time_limit_seconds),
            "max_jobs": self.max_jobs, "nvcc_threads": self.nvcc_threads,
            "ranges_from": self.ranges_from,
        }

    def line(self) -> str:
        lo, hi = self.seconds
        return (f"{self.name}: {len(self.cells)} cell(s), {self.cpus} CPU(s), "
                f"{format_size(self.memory_bytes)} (peak {format_size(self.peak_bytes[0])}"
                f"-{format_size(self.peak_bytes[1])}), {lo / 60:.0f}-{hi / 60:.0f} min, "
                f"{self.machine}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refused:
    """A group no allocation of the given size can build (the planner's reason)."""

    name: str
    cells: tuple[str, ...]
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Work:
    groups: tuple[WorkGroup, ...]  # longest first
    refused: tuple[Refused, ...]
    memory_bytes: int  # the largest allocation it was planned for
    cpus: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": WORK_VERSION,
            "allocation": {"memory_bytes": self.memory_bytes, "cpus": self.cpus},
            "groups": [g.as_dict() for g in self.groups],
            "refused": [{"name": r.name, "cells": list(r.cells), "reason": r.reason}
                        for r in self.refused],
        }

    def lines(self) -> list[str]:
        out = [f"{len(self.groups)} group(s) of {sum(len(g.cells) for g in self.groups)} "
               f"cell(s), longest first, for allocations of at most "
               f"{format_size(self.memory_bytes)} and {self.cpus} CPU(s):"]
        for g in self.groups:
            out.append("  " + g.line())
            out += [f"      {c}" for c in g.cells]
        out += [f"refused {r.name}: {r.reason}" for r in self.refused]
        return out


def memory_arg(n: int) -> str:
    """A size as engines write it, in whole MiB: Slurm's ``--mem=4352M``."""
    return f"{math.ceil(n / 2**20)}M"


def _round_up(n: float, step: int) -> int:
    return int(math.ceil(n / step) * step)


def work_group(g: Group, *, memory: int, cpus: int, history: MemoryHistory,
               times: CellTimes | None = None, spread: bool = True) -> WorkGroup:
    """The group's allocation within ``memory`` and ``cpus``; PlanError when it fits none.
    With ``spread`` (an allocation to ask for) planned so that the top of its peak range fits
    ``memory``; without (a worker's own machine) at ``memory`` itself, as a build there plans."""
    plan = (plan_within(g, memory=memory, cpus=cpus, history=history) if spread
            else plan_group(g, memory=memory, cpus=cpus, history=history))
    archs = len(g.cells[0].cell.archs)
    used = max(1, min(cpus, plan.max_jobs * min(plan.nvcc_threads, archs)))
    peak = plan.predicted_peak_bytes
    (low, high), peak_planned = peak_range(plan)
    ask = min(memory, max(_round_up(high, MEMORY_ROUND), peak))
    times = times or CellTimes(history)
    phases = times.phases(g, ask, used)
    if phases is None:  # the planner took the whole allocation and refuses the share
        raise PlanError(f"{g.name}: no plan at {format_size(ask)} and {used} CPU(s)")
    point = shared_span(used, [phases])[0]
    factors, seconds_planned = seconds_factors(plan)
    lo, hi = (point * f for f in factors)
    fixed = [what for what, planned in (("peak", peak_planned), ("time", seconds_planned))
             if not planned]
    return WorkGroup(
        id=group_id(g), name=g.name, machine=g.cells[0].cell.platform, platform=g.platform,
        cells=tuple(pc.cell.id for pc in g.cells),
        content_keys=tuple(pc.content_key for pc in g.cells), cpus=used, memory_bytes=ask,
        peak_bytes=(low, high), seconds=(lo, hi), predicted_seconds=point,
        max_jobs=plan.max_jobs, nvcc_threads=plan.nvcc_threads, group=g,
        ranges_from="planner" if not fixed else f"fixed spread for the {' and '.join(fixed)}",
    )


def fewest_cpus(w: WorkGroup, *, memory: int, history: MemoryHistory,
                times: CellTimes) -> WorkGroup:
    """The allocation with the fewest CPUs whose predicted time is within CPU_SLACK of ``w``'s
    (the fastest): past the point where the longest object bounds a cell, more CPUs buy
    nothing and would sit idle in a shared cluster (flash-attn sm_100 at 512 GiB: 73 CPUs and
    40 CPUs predict the same 8 min)."""
    limit = w.predicted_seconds * (1 + CPU_SLACK)
    for c in range(1, w.cpus):
        try:
            narrow = work_group(w.group, memory=memory, cpus=c, history=history, times=times)
        except PlanError:
            continue
        if narrow.predicted_seconds <= limit:
            return narrow
    return w


def plan_work(cells: Iterable[PlannedCell], *, memory: int, cpus: int,
              history: MemoryHistory, spread: bool = True) -> Work:
    """The work of ``cells`` for allocations of at most ``memory`` bytes and ``cpus`` CPUs:
    their groups longest first, and the ones no such allocation can build (``spread``: see
    ``work_group``)."""
    times = CellTimes(history)
    found: list[WorkGroup] = []
    refused: list[Refused] = []
    for g in group_cells(cells):
        try:
            w = work_group(g, memory=memory, cpus=cpus, history=history, times=times,
                           spread=spread)
            found.append(fewest_cpus(w, memory=memory, history=history, times=times)
                         if spread else w)
        except PlanError as exc:
            refused.append(Refused(name=g.name, cells=tuple(pc.cell.id for pc in g.cells),
                                   reason=exc.message))
    return Work(groups=tuple(longest_first(found)), refused=tuple(refused),
                memory_bytes=memory, cpus=cpus)


def longest_first(groups: Sequence[WorkGroup]) -> list[WorkGroup]:
    return sorted(groups, key=lambda w: (-w.predicted_seconds, w.name))
