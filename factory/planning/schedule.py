"""From one cell to the whole matrix: which builder builds which cells, in what order.

Cells that share compiled objects (same package, version, torch, CUDA, arch set and platform;
any Python) form a group and go to one builder slot in sequence, so every cell after the first
takes its kernels from the compile cache (docs/BENCHMARKS.md "Compile cache": a second Python
version's compile is 10 % of the first for the bundled extension, 0-3 % for flash-attn's
kernels; the 10 % is used). Groups go longest first (by CPU work) to the builder whose
predicted end grows least.

A builder runs its groups in lanes side by side, as many as its memory allows (at most
MAX_LANES): each lane's cells are planned with the builder's memory divided by the lanes (one
shared budget, nothing counted twice) and all its CPUs, so the CPUs are shared: a lane that
finishes, or a cell in its single-threaded link, leaves its CPUs to the others (oversubscribed
compilers slow each other proportionally; replay.contention_factor). A cell is a compile phase
(its objects' measured CPU seconds, at most its planned jobs at once, never shorter than its
longest object) and the measured per-cell overhead outside the compile (link, tag, repair,
verify: 79 s in the H200 run of 2026-11-29), simulated by ``shared_span``. A cell the planner
refuses at a lane's memory cannot go there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from factory.errors import ConfigError, PlanError
from factory.matrix.load import PlannedCell
from factory.matrix.tags import wheel_platform
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import plan_for
from factory.planning.replay import contention_factor
from factory.units import format_size, parse_size

CACHED_FRACTION = 0.10  # a later Python version's compile against the first's (measured)
CELL_OVERHEAD_SECONDS = 79.0  # link + tag + repair + verify of one flash-attn cell (measured)
UNKNOWN_COMPILE_SECONDS = 600.0  # a package with no object times in the history
MAX_LANES = 16  # cells a builder runs side by side at most
SCHEDULE_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Builder:
    name: str
    memory_bytes: int
    cpus: int
    platform: str  # machine, e.g. "x86_64": builds the cells whose wheel tag ends with it
    labels: tuple[str, ...] = ()

    def builds(self, plat: str) -> bool:
        """Cells for its own CPU, and the ones it cross-builds (factory.toolchain.cross)."""
        from factory.toolchain.cross import can_build

        machine = wheel_platform([plat])
        return can_build(builder=self.platform, target=machine)


def load_builders(path: Path) -> tuple[Builder, ...]:
    """A TOML file of ``[[builder]]`` tables: name, memory ("256g"), cpus, platform, labels."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read builders file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"builders file {path} is not valid TOML: {exc}") from None
    return builders_from(doc.get("builder", []), where=str(path))


def builders_from(tables: Iterable[Mapping[str, Any]], *, where: str = "builders") -> tuple[
        Builder, ...]:
    out: list[Builder] = []
    known = {"name", "memory", "cpus", "platform", "labels"}
    for i, t in enumerate(tables):
        extra = set(t) - known
        if extra:
            raise ConfigError(f"{where}: builder {i + 1} has unknown key(s) {sorted(extra)}")
        try:
            b = Builder(name=str(t["name"]), memory_bytes=parse_size(str(t["memory"])),
                        cpus=int(t["cpus"]), platform=str(t.get("platform", "x86_64")),
                        labels=tuple(str(x) for x in t.get("labels", ())))
        except KeyError as exc:
            raise ConfigError(f"{where}: builder {i + 1} lacks {exc}") from None
        if b.cpus < 1 or b.memory_bytes < 1:
            raise ConfigError(f"{where}: builder {b.name} needs memory and cpus above 0")
        out.append(b)
    if not out:
        raise ConfigError(f"{where}: no [[builder]] tables")
    if len({b.name for b in out}) != len(out):
        raise ConfigError(f"{where}: builder names must be unique")
    return tuple(out)


def platform_of(pc: PlannedCell) -> str:
    """The wheel's platform tag (its file name's last part)."""
    return pc.wheel.removesuffix(".whl").rsplit("-", 1)[-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Group:
    """Cells that share every compiled kernel: one package/version/torch/CUDA/archs/platform."""

    key: tuple[str, ...]
    cells: tuple[PlannedCell, ...]  # by Python version

    @property
    def platform(self) -> str:
        return self.key[-1]

    @property
    def name(self) -> str:
        first = self.cells[0].cell
        return (f"{first.package}-{first.version}-torch{first.torch}-cu"
                f"{first.cuda.replace('.', '')}-{'+'.join(f'sm{a}' for a in first.archs)}"
                f"-{self.platform}")


def group_cells(cells: Iterable[PlannedCell]) -> tuple[Group, ...]:
    by_key: dict[tuple[str, ...], list[PlannedCell]] = {}
    for pc in cells:
        c = pc.cell
        key = (c.package, c.version, c.torch, c.cuda, ",".join(map(str, c.archs)),
               platform_of(pc))
        by_key.setdefault(key, []).append(pc)
    return tuple(
        Group(key=k, cells=tuple(sorted(v, key=lambda pc: tuple(
            int(x) for x in pc.cell.python.split(".")))))
        for k, v in sorted(by_key.items()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Phase:
    """A stretch of one cell: ``work`` CPU-seconds on at most ``parallel`` CPUs at once, and
    never in less than ``longest`` seconds (its longest object)."""

    work: float
    parallel: int
    longest: float

    @property
    def cap(self) -> float:
        return min(float(self.parallel), self.work / self.longest) if self.longest else \
            float(self.parallel)


def overhead() -> Phase:
    return Phase(work=CELL_OVERHEAD_SECONDS, parallel=1, longest=CELL_OVERHEAD_SECONDS)


class CellTimes:
    """A cell's compile as work and parallelism at a (memory, CPUs) share; cached."""

    def __init__(self, history: MemoryHistory) -> None:
        self.history = history
        self._memo: dict[tuple[Any, ...], Phase | None] = {}

    def compile(self, pc: PlannedCell, memory: int, cpus: int) -> Phase | None:
        """None: the planner refuses the cell at this memory."""
        c = pc.cell
        key = (c.package, c.version, c.cuda, c.archs, memory, cpus)
        if key not in self._memo:
            self._memo[key] = self._compile(pc, memory, cpus)
        return self._memo[key]

    def _compile(self, pc: PlannedCell, memory: int, cpus: int) -> Phase | None:
        try:
            plan = plan_for(pc.cell, supports_threads=pc.recipe.supports_threads(),
                            memory_model_key=pc.recipe.memory_model_key or pc.recipe.name,
                            memory=memory, cpus=cpus, history=self.history)
        except PlanError:
            return None
        archs = len(pc.cell.archs)
        parallel = plan.max_jobs * min(plan.nvcc_threads, archs)
        times = self.history.object_times(pc.cell)
        if times is None or not times.seconds:
            return Phase(work=UNKNOWN_COMPILE_SECONDS * parallel, parallel=parallel,
                         longest=UNKNOWN_COMPILE_SECONDS)
        base = dataclasses.replace(times, seconds=times.alone())
        seconds = base.scaled(archs, plan.nvcc_threads)
        # every CPU busy: each object at the full contention factor
        busy = contention_factor(1, 1)
        per_arch = min(plan.nvcc_threads, archs)
        return Phase(work=sum(seconds.values()) * busy * per_arch, parallel=parallel,
                     longest=max(seconds.values()) * busy)

    def phases(self, g: Group, memory: int, cpus: int) -> list[Phase] | None:
        """The group's cells in order: the first compiles everything, the later ones
        CACHED_FRACTION of it; each adds the overhead."""
        first = self.compile(g.cells[0], memory, cpus)
        if first is None:
            return None
        cached = dataclasses.replace(first, work=first.work * CACHED_FRACTION,
                                     longest=first.longest * CACHED_FRACTION)
        out = [first, overhead()]
        for _ in g.cells[1:]:
            out += [cached, overhead()]
        return out

    def work(self, g: Group, memory: int, cpus: int) -> float | None:
        phases = self.phases(g, memory, cpus)
        return None if phases is None else sum(p.work for p in phases)


def shared_span(cpus: int, lanes: Sequence[Sequence[Phase]]) -> list[float]:
    """When each lane ends, with the lanes running side by side on ``cpus`` CPUs.

    The CPUs are shared out evenly among the running phases, none getting more than its cap
    (what oversubscribed compilers do: a finished cell's CPUs go to the others). Returns the
    end time of each lane."""
    pos = [0] * len(lanes)
    done = [0.0] * len(lanes)  # work done of the current phase
    ends = [0.0] * len(lanes)
    now = 0.0
    while True:
        active = [i for i, lane in enumerate(lanes) if pos[i] < len(lane)]
        if not active:
            return ends
        # water-fill the CPUs
        rate: dict[int, float] = {}
        left, todo = float(cpus), sorted(active, key=lambda i: lanes[i][pos[i]].cap)
        while todo:
            share = left / len(todo)
            i = todo[0]
            cap = lanes[i][pos[i]].cap
            if cap <= share:
                rate[i] = cap
                left -= cap
                todo.pop(0)
            else:
                for j in todo:
                    rate[j] = share
                todo = []
        step = min((lanes[i][pos[i]].work - done[i]) / rate[i] for i in active)
        now += step
        for i in active:
            done[i] += rate[i] * step
            if done[i] >= lanes[i][pos[i]].work - 1e-6:
                pos[i] += 1
                done[i] = 0.0
                if pos[i] == len(lanes[i]):
                    ends[i] = now


def _lanes(b: Builder, groups: Sequence[Group], times: CellTimes
           ) -> tuple[int, list[list[Group]], list[float]] | None:
    """Run ``groups`` on builder ``b`` in the number of lanes side by side that ends first
    (each cell planned with memory / lanes and all the CPUs: more lanes keep the CPUs busy,
    fewer give each cell more jobs), longest first onto the least loaded lane. Returns
    (lanes, groups per lane, end per lane), or None when not even one lane fits a group."""
    best: tuple[int, list[list[Group]], list[float]] | None = None
    for k in range(1, min(len(groups), MAX_LANES) + 1):
        share = b.memory_bytes // k
        phases = {g.key: times.phases(g, share, b.cpus) for g in groups}
        if any(p is None for p in phases.values()):
            continue
        lanes: list[list[Group]] = [[] for _ in range(k)]
        load = [0.0] * k
        for g in sorted(groups, key=lambda g: -sum(p.work for p in phases[g.key] or ())):
            i = load.index(min(load))
            lanes[i].append(g)
            load[i] += sum(p.work for p in phases[g.key] or ())
        ends = shared_span(b.cpus, [[p for g in lane for p in phases[g.key] or ()]
                                    for lane in lanes])
        if best is None or max(ends) < max(best[2]):
            best = (k, lanes, ends)
    return best


@dataclasses.dataclass(frozen=True, kw_only=True)
class Slot:
    builder: str
    index: int
    memory_bytes: int
    cpus: int
    groups: tuple[str, ...]
    cells: tuple[str, ...]  # in build order
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
    slots: tuple[Slot, ...]
    makespan_seconds: float
    lower_bound_seconds: float
    unplaced: tuple[str, ...]  # cells no builder can build (platform or memory)

    def as_dict(self) -> dict[str, Any]:
        builders: dict[str, list[dict[str, Any]]] = {}
        for s in self.slots:
            builders.setdefault(s.builder, []).append({
                "slot": s.index, "memory_bytes": s.memory_bytes, "cpus": s.cpus,
                "memory": f"{s.memory_bytes // 2**20}m",
                "cells": list(s.cells), "groups": list(s.groups),
                "predicted_seconds": round(s.seconds, 1),
            })
        return {
            "version": SCHEDULE_VERSION,
            "makespan_seconds": round(self.makespan_seconds, 1),
            "lower_bound_seconds": round(self.lower_bound_seconds, 1),
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
        out.append(f"predicted makespan {self.makespan_seconds / 60:.0f} min (lower bound "
                   f"{self.lower_bound_seconds / 60:.0f} min)")
        out += [f"unplaced: {c} (no builder has its platform or the memory)"
                for c in self.unplaced]
        return out


def lower_bound(groups: Sequence[Group], builders: Sequence[Builder],
                times: CellTimes) -> float:
    """No schedule beats max(all groups' CPU work / all CPUs, the longest group alone on the
    builder where it is fastest). CPU work: the group's phases at one CPU (the cache effect
    and the overheads included); nothing a schedule does shrinks it."""
    work = 0.0
    longest = 0.0
    for g in groups:
        fits = [b for b in builders if b.builds(g.platform)]
        alone = [shared_span(b.cpus, [p])[0] for b in fits
                 if (p := times.phases(g, b.memory_bytes, b.cpus)) is not None]
        if not alone:
            continue
        longest = max(longest, min(alone))
        one = [w for b in fits if (w := times.work(g, b.memory_bytes, 1)) is not None]
        work += min(one) if one else 0.0
    return max(work / max(1, sum(b.cpus for b in builders)), longest)


def _improve(given: dict[str, list[Group]], ends: dict[str, float],
             builders: Sequence[Builder], times: CellTimes, rounds: int = 50) -> None:
    """Greedy LPT leaves the last builder long: move one of its groups to another builder, or
    swap it for one of theirs, while that shortens the makespan."""
    by_name = {b.name: b for b in builders}

    def end_of(name: str, groups: list[Group]) -> float | None:
        if not groups:
            return 0.0
        found = _lanes(by_name[name], groups, times)
        return None if found is None else max(found[2])

    for _ in range(rounds):
        worst = max(ends, key=lambda n: ends[n])
        span = ends[worst]
        move: tuple[float, str, list[Group], list[Group], float, float] | None = None
        for g in given[worst]:
            for other in by_name:
                if other == worst or not by_name[other].builds(g.platform):
                    continue
                # move g, or swap it for one of other's groups of another size
                back: list[Group | None] = [None] + [
                    h for h in given[other] if by_name[worst].builds(h.platform)
                    and h.key[:-1] != g.key[:-1]]
                for h in back:
                    mine = [x for x in given[worst] if x is not g] + ([h] if h else [])
                    theirs = [x for x in given[other] if x is not h] + [g]
                    left, there = end_of(worst, mine), end_of(other, theirs)
                    if left is None or there is None:
                        continue
                    new = max([left, there] + [e for n, e in ends.items()
                                               if n not in (worst, other)])
                    if new < span - 1e-6 and (move is None or new < move[0]):
                        move = (new, other, mine, theirs, left, there)
        if move is None:
            return
        _, other, mine, theirs, left, there = move
        given[worst], given[other] = mine, theirs
        ends[worst], ends[other] = left, there


def schedule(cells: Iterable[PlannedCell], builders: Sequence[Builder], *,
             history: MemoryHistory) -> Schedule:
    """Longest group first, to the builder whose predicted end grows least."""
    groups = group_cells(cells)
    times = CellTimes(history)
    given: dict[str, list[Group]] = {b.name: [] for b in builders}
    ends: dict[str, float] = {b.name: 0.0 for b in builders}
    unplaced: list[Group] = []

    def size(g: Group) -> float:
        works = [w for b in builders if b.builds(g.platform)
                 if (w := times.work(g, b.memory_bytes, 1)) is not None]
        return max(works, default=0.0)

    for g in sorted(groups, key=size, reverse=True):
        best: tuple[float, float, str] | None = None
        for b in builders:
            if not b.builds(g.platform):
                continue
            found = _lanes(b, given[b.name] + [g], times)
            if found is None:
                continue
            end = max(found[2])
            rank = (max(end, *ends.values()), end, b.name)
            if best is None or rank < best:
                best = rank
        if best is None:
            unplaced.append(g)
            continue
        given[best[2]].append(g)
        ends[best[2]] = best[1]
    _improve(given, ends, builders, times)
    out: list[Slot] = []
    for b in builders:
        found = _lanes(b, given[b.name], times) if given[b.name] else None
        if found is None:
            continue
        k, lanes, lane_ends = found
        for i, (lane, end) in enumerate(zip(lanes, lane_ends, strict=True)):
            out.append(Slot(builder=b.name, index=i, memory_bytes=b.memory_bytes // k,
                            cpus=b.cpus, groups=tuple(g.name for g in lane),
                            cells=tuple(pc.cell.id for g in lane for pc in g.cells),
                            seconds=end))
    return Schedule(
        slots=tuple(out), makespan_seconds=max((s.seconds for s in out), default=0.0),
        lower_bound_seconds=lower_bound(groups, builders, times),
        unplaced=tuple(pc.cell.id for g in unplaced for pc in g.cells),
    )
