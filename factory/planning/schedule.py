"""From one cell to the whole matrix on static builders: which builder builds which cells, in
what order.

The cells are grouped by shared kernels (``groups.group_cells``); groups go whole to builders
(``assign``), each builder's share runs in lanes side by side (``lanes``), and two lower
bounds come with the schedule (``bounds``). The time of a cell and of lanes sharing CPUs is
``cell_times``'s model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from factory.matrix.load import PlannedCell
from factory.planning.assign import EXACT_SPANS, assign
from factory.planning.bounds import group_bound, lower_bound
from factory.planning.builders import Builder
from factory.planning.cell_times import CellTimes, shared_span
from factory.planning.groups import group_cells
from factory.planning.lanes import _lanes
from factory.planning.memory_model import MemoryHistory
from factory.units import format_size

SCHEDULE_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Slot:
    builder: str
    index: int
    memory_bytes: int
    cpus: int
    groups: tuple[str, ...]
    cells: tuple[str, ...]  # in build order
    seconds: float
    cell_ends: tuple[float, ...] = ()  # when each cell ends (predicted), for the lanes picture


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
    slots: tuple[Slot, ...]
    makespan_seconds: float
    lower_bound_seconds: float  # the fluid bound (``lower_bound``), for every policy
    group_bound_seconds: float  # the policy-family bound (``group_bound``), never below it
    unplaced: tuple[str, ...]  # cells no builder can build (platform or memory)

    def as_dict(self) -> dict[str, Any]:
        builders: dict[str, list[dict[str, Any]]] = {}
        for s in self.slots:
            builders.setdefault(s.builder, []).append({
                "slot": s.index, "memory_bytes": s.memory_bytes, "cpus": s.cpus,
                "memory": f"{s.memory_bytes // 2**20}m",
                "cells": list(s.cells), "groups": list(s.groups),
                "predicted_seconds": round(s.seconds, 1),
                "cell_ends_seconds": [round(t, 1) for t in s.cell_ends],
            })
        return {
            "version": SCHEDULE_VERSION,
            "makespan_seconds": round(self.makespan_seconds, 1),
            "lower_bound_seconds": round(self.lower_bound_seconds, 1),
            "group_bound_seconds": round(self.group_bound_seconds, 1),
            "builders": [{"name": n, "slots": v} for n, v in builders.items()],
            "include": [{"builder": n, "slots": len(v)} for n, v in builders.items()
                        if any(s["cells"] for s in v)],
            "unplaced": list(self.unplaced),
        }

    def lines(self) -> list[str]:
        out = []
        for s in self.slots:
            if not s.cells:
                continue
            out.append(f"{s.builder} slot {s.index} ({format_size(s.memory_bytes)}, {s.cpus} "
                       f"CPUs): {len(s.cells)} cell(s), predicted {s.seconds / 60:.0f} min")
            out += [f"    {c}" for c in s.cells]
        out.append(f"predicted makespan {self.makespan_seconds / 60:.0f} min (lower bounds: "
                   f"any policy {self.lower_bound_seconds / 60:.0f} min, the factory's whole "
                   f"groups in lanes {self.group_bound_seconds / 60:.0f} min)")
        out += [f"unplaced: {c} (no builder has its platform or the memory)"
                for c in self.unplaced]
        return out


def schedule(cells: Iterable[PlannedCell], builders: Sequence[Builder], *,
             history: MemoryHistory, exact_spans: int = EXACT_SPANS) -> Schedule:
    """Whole groups to builders (``assign``), each builder's share in lanes (``_lanes``)."""
    groups = group_cells(cells)
    times = CellTimes(history)
    given, unplaced = assign(groups, builders, times, exact_spans=exact_spans)
    out: list[Slot] = []
    for b in builders:
        found = _lanes(b, given[b.name], times) if given[b.name] else None
        if found is None:
            continue
        k, lanes, lane_ends = found
        phase_ends: list[list[float]] = []
        phases = {g.key: times.phases(g, b.memory_bytes // k, b.cpus) for g in given[b.name]}
        shared_span(b.cpus, [[p for g in lane for p in phases[g.key] or ()] for lane in lanes],
                    phase_ends)
        for i, (lane, end) in enumerate(zip(lanes, lane_ends, strict=True)):
            out.append(Slot(builder=b.name, index=i, memory_bytes=b.memory_bytes // k,
                            cpus=b.cpus, groups=tuple(g.name for g in lane),
                            cells=tuple(pc.cell.id for g in lane for pc in g.cells),
                            seconds=end, cell_ends=tuple(phase_ends[i][1::2])))
    fluid = lower_bound(groups, builders, times)
    return Schedule(
        slots=tuple(out), makespan_seconds=max((s.seconds for s in out), default=0.0),
        lower_bound_seconds=fluid,
        group_bound_seconds=max(fluid, group_bound(groups, builders, times)),
        unplaced=tuple(pc.cell.id for g in unplaced for pc in g.cells),
    )
