"""A cell's time as the schedule sees it: a compile phase and an overhead phase, and lanes of
them sharing a builder's CPUs.

A cell is a compile phase (its objects' measured CPU seconds, at most its planned jobs at once,
never shorter than its planner's predicted span alone: factory.planning.cell_model, the one cell
model `factory plan` uses too) and the measured per-cell overhead outside the compile (venv and
pip, link, tag, repair, verify). A group's later cells compile
CACHED_FRACTION of the first (docs/BENCHMARKS.md "Compile cache": a second Python version's
compile is 10 % of the first for the bundled extension, 0-3 % for flash-attn's kernels; the
10 % is used). Lanes side by side share the CPUs (``shared_span``): a lane that finishes, or a
cell in its single-threaded link, leaves its CPUs to the others (oversubscribed compilers slow
each other proportionally; replay.contention_factor).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from factory.errors import PlanError
from factory.matrix.load import PlannedCell
from factory.planning.cell_model import CELL_OVERHEAD_SECONDS, cell_time, overhead_of
from factory.planning.groups import Group
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import plan_for

CACHED_FRACTION = 0.10  # a later Python version's compile against the first's (measured)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Phase:
    """A stretch of one cell: ``work`` CPU-seconds on at most ``parallel`` CPUs at once, and
    never in less than ``longest`` seconds (a compile: the planner's span alone on its CPUs,
    which is at least its longest object)."""

    work: float
    parallel: int
    longest: float

    @functools.cached_property
    def cap(self) -> float:
        # cached: the schedule's search asks it tens of millions of times
        return min(float(self.parallel), self.work / self.longest) if self.longest else \
            float(self.parallel)


def overhead(seconds: float = CELL_OVERHEAD_SECONDS) -> Phase:
    return Phase(work=seconds, parallel=1, longest=seconds)


class CellTimes:
    """A cell's compile as work and parallelism at a (memory, CPUs) share; cached."""

    def __init__(self, history: MemoryHistory) -> None:
        self.history = history
        self._memo: dict[tuple[Any, ...], Phase | None] = {}
        self._overheads: dict[str, Phase] = {}

    def compile(self, pc: PlannedCell, memory: int, cpus: int, *,
                machine_cpus: int | None = None) -> Phase | None:
        """None: the planner refuses the cell at this memory. ``machine_cpus``: the builder's
        CPUs where ``cpus`` is less (they pick the machine speed: planner.plan_for)."""
        c = pc.cell
        key = (c.package, c.version, c.cuda, c.archs, memory, cpus, machine_cpus)
        if key not in self._memo:
            self._memo[key] = self._compile(pc, memory, cpus, machine_cpus)
        return self._memo[key]

    def _compile(self, pc: PlannedCell, memory: int, cpus: int,
                 machine_cpus: int | None) -> Phase | None:
        key = pc.recipe.memory_model_key or pc.recipe.name
        try:
            plan = plan_for(pc.cell, supports_threads=pc.recipe.supports_threads(),
                            memory_model_key=key, memory=memory, cpus=cpus,
                            history=self.history, machine_cpus=machine_cpus)
        except PlanError:
            return None
        t = cell_time(pc.cell, plan, self.history, model_key=key, machine_cpus=machine_cpus)
        return Phase(work=t.cpu_seconds, parallel=t.parallel, longest=t.compile_seconds)

    def overhead(self, pc: PlannedCell) -> Phase:
        """The cell's measured overhead outside the compile (cell_model.overhead_of)."""
        key = pc.recipe.memory_model_key or pc.recipe.name
        if key not in self._overheads:
            self._overheads[key] = overhead(overhead_of(self.history, key)[0])
        return self._overheads[key]

    def phases(self, g: Group, memory: int, cpus: int, *,
               machine_cpus: int | None = None) -> list[Phase] | None:
        """The group's cells in order: the first compiles everything, the later ones
        CACHED_FRACTION of it; each adds the overhead."""
        first = self.compile(g.cells[0], memory, cpus, machine_cpus=machine_cpus)
        if first is None:
            return None
        cached = dataclasses.replace(first, work=first.work * CACHED_FRACTION,
                                     longest=first.longest * CACHED_FRACTION)
        out = [first, self.overhead(g.cells[0])]
        for pc in g.cells[1:]:
            out += [cached, self.overhead(pc)]
        return out

    def work(self, g: Group, memory: int, cpus: int, *,
             machine_cpus: int | None = None) -> float | None:
        phases = self.phases(g, memory, cpus, machine_cpus=machine_cpus)
        return None if phases is None else sum(p.work for p in phases)


def shared_span(cpus: int, lanes: Sequence[Sequence[Phase]],
                phase_ends: list[list[float]] | None = None) -> list[float]:
    """When each lane ends, with the lanes running side by side on ``cpus`` CPUs.

    The CPUs are shared out evenly among the running phases, none getting more than its cap
    (what oversubscribed compilers do: a finished cell's CPUs go to the others). Returns the
    end time of each lane; ``phase_ends`` (given empty) gets each lane's phase end times."""
    if phase_ends is not None:
        phase_ends[:] = [[] for _ in lanes]
    # The schedule's search runs this hundreds of thousands of times: plain lists by lane
    # index, and the same arithmetic in the same order as the phases themselves would give.
    works = [[p.work for p in lane] for lane in lanes]
    caps = [[p.cap for p in lane] for lane in lanes]
    sizes = [len(lane) for lane in lanes]
    pos = [0] * len(lanes)
    done = [0.0] * len(lanes)  # work done of the current phase
    ends = [0.0] * len(lanes)
    now = 0.0
    active = [i for i in range(len(lanes)) if sizes[i]]
    while active:
        # water-fill the CPUs
        rate: dict[int, float] = {}
        left = float(cpus)
        todo = sorted(active, key=lambda i: caps[i][pos[i]])
        for n, i in enumerate(todo):
            share = left / (len(todo) - n)
            cap = caps[i][pos[i]]
            if cap <= share:
                rate[i] = cap
                left -= cap
            else:
                for j in todo[n:]:
                    rate[j] = share
                break
        step = min((works[i][pos[i]] - done[i]) / rate[i] for i in active)
        now += step
        for i in active:
            done[i] += rate[i] * step
            if done[i] >= works[i][pos[i]] - 1e-6:
                if phase_ends is not None:
                    phase_ends[i].append(now)
                pos[i] += 1
                done[i] = 0.0
                if pos[i] == sizes[i]:
                    ends[i] = now
        active = [i for i in active if pos[i] < sizes[i]]
    return ends
