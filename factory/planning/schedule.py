"""From one cell to the whole matrix: which builder builds which cells, in what order.

Cells that share compiled objects (same package, version, torch, CUDA, arch set and platform;
any Python) form a group and go to one builder slot in sequence, so every cell after the first
takes its kernels from the compile cache (docs/BENCHMARKS.md "Compile cache": a second Python
version's compile is 10 % of the first for the bundled extension, 0-3 % for flash-attn's
kernels; the 10 % is used). Groups are assigned longest predicted first (LPT) to the slot that
finishes them first. A builder runs ``slots`` groups at once and splits its memory and CPUs
evenly between them (one shared budget, nothing counted twice); the number of slots per
builder is chosen to minimise the predicted makespan.

A cell's time on a slot: the planner's predicted compile time at that slot's memory and CPUs
(factory.planning.planner.plan_for: per-object times, longest first, contention), plus the
measured per-cell overhead outside the compile (link, tag, repair, verify: 79 s in the H200
run of 2026-11-29). A cell the planner refuses at a slot's memory cannot go there.
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from factory.errors import ConfigError, PlanError
from factory.matrix.load import PlannedCell
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import plan_for
from factory.units import format_size, parse_size

CACHED_FRACTION = 0.10  # a later Python version's compile against the first's (measured)
CELL_OVERHEAD_SECONDS = 79.0  # link + tag + repair + verify of one flash-attn cell (measured)
UNKNOWN_COMPILE_SECONDS = 600.0  # a package with no object times in the history
SLOT_CHOICES = (1, 2, 3, 4, 6, 8)  # cells a builder may run at once
SCHEDULE_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Builder:
    name: str
    memory_bytes: int
    cpus: int
    platform: str  # machine, e.g. "x86_64": builds the cells whose wheel tag ends with it
    labels: tuple[str, ...] = ()

    def builds(self, plat: str) -> bool:
        return plat.endswith("_" + self.platform) or plat == self.platform


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


class CellTimes:
    """Predicted seconds of a cell at a (memory, CPUs) slot; cached, since groups repeat."""

    def __init__(self, history: MemoryHistory) -> None:
        self.history = history
        self._memo: dict[tuple[Any, ...], float | None] = {}

    def first(self, pc: PlannedCell, memory: int, cpus: int) -> float | None:
        """Cold compile + overhead; None: the planner refuses the cell at this memory."""
        key = (pc.cell.package, pc.cell.version, pc.cell.cuda, pc.cell.archs, memory, cpus)
        if key not in self._memo:
            try:
                plan = plan_for(pc.cell, supports_threads=pc.recipe.supports_threads(),
                                memory_model_key=pc.recipe.memory_model_key or pc.recipe.name,
                                memory=memory, cpus=cpus, history=self.history)
            except PlanError:
                self._memo[key] = None
            else:
                compile_s = plan.predicted_seconds
                self._memo[key] = (UNKNOWN_COMPILE_SECONDS if compile_s is None else compile_s)
        found = self._memo[key]
        return None if found is None else found + CELL_OVERHEAD_SECONDS

    def group(self, g: Group, memory: int, cpus: int) -> float | None:
        first = self.first(g.cells[0], memory, cpus)
        if first is None:
            return None
        later = (first - CELL_OVERHEAD_SECONDS) * CACHED_FRACTION + CELL_OVERHEAD_SECONDS
        return first + later * (len(g.cells) - 1)


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


def _assign(groups: Sequence[Group], builders: Sequence[Builder], slots: Sequence[int],
            times: CellTimes) -> tuple[float, list[tuple[Builder, int, list[Group], float]],
                                        list[Group]]:
    """LPT: each group, longest first, to the slot where it would finish first."""
    lanes: list[tuple[Builder, int, list[Group], float]] = []
    for b, k in zip(builders, slots, strict=True):
        lanes += [(b, i, [], 0.0) for i in range(k)]
    size = {b.name: (b.memory_bytes // k, max(1, b.cpus // k))
            for b, k in zip(builders, slots, strict=True)}

    def longest(g: Group) -> float:
        best = [t for b in builders if b.builds(g.platform)
                if (t := times.group(g, *size[b.name])) is not None]
        return min(best) if best else -1.0

    unplaced: list[Group] = []
    for g in sorted(groups, key=longest, reverse=True):
        choice: tuple[float, int] | None = None
        for i, (b, _, _, end) in enumerate(lanes):
            if not b.builds(g.platform):
                continue
            t = times.group(g, *size[b.name])
            if t is not None and (choice is None or end + t < choice[0]):
                choice = (end + t, i)
        if choice is None:
            unplaced.append(g)
            continue
        end, i = choice
        b, idx, gs, _ = lanes[i]
        lanes[i] = (b, idx, gs + [g], end)
    return max((lane[3] for lane in lanes), default=0.0), lanes, unplaced


def lower_bound(groups: Sequence[Group], builders: Sequence[Builder],
                times: CellTimes) -> float:
    """No schedule beats max(CPU work / all CPUs, the longest group at its fastest).

    CPU work of a group: its fastest time on one whole builder x that builder's CPUs is an
    upper bound, so the work is taken at one CPU's worth instead: the group's time on the
    largest builder x its CPUs, divided by the CPUs; the group at its fastest is its time on
    the builder where it runs fastest (whole builder). Both use the cache effect.
    """
    work = 0.0
    longest = 0.0
    for g in groups:
        fits = [b for b in builders if b.builds(g.platform)]
        options = [(t, b) for b in fits
                   if (t := times.group(g, b.memory_bytes, b.cpus)) is not None]
        if not options:
            continue
        longest = max(longest, min(t for t, _ in options))
        one = [t for b in fits if (t := times.group(g, b.memory_bytes, 1)) is not None]
        if one:
            work += min(one)
    total_cpus = sum(b.cpus for b in builders)
    return max(work / max(1, total_cpus), longest)


def schedule(cells: Iterable[PlannedCell], builders: Sequence[Builder], *,
             history: MemoryHistory) -> Schedule:
    groups = group_cells(cells)
    times = CellTimes(history)
    best: tuple[float, Any, Any] | None = None
    for slots in itertools.product(SLOT_CHOICES, repeat=len(builders)):
        if any(k > b.cpus for k, b in zip(slots, builders, strict=True)):
            continue
        span, lanes, unplaced = _assign(groups, builders, slots, times)
        rank = (len(unplaced), span)
        if best is None or rank < best[0]:
            best = (rank, lanes, unplaced)
    assert best is not None
    _, lanes, unplaced = best
    out: list[Slot] = []
    for b, idx, gs, end in lanes:
        k = sum(1 for lane in lanes if lane[0] is b)
        out.append(Slot(builder=b.name, index=idx, memory_bytes=b.memory_bytes // k,
                        cpus=max(1, b.cpus // k), groups=tuple(g.name for g in gs),
                        cells=tuple(pc.cell.id for g in gs for pc in g.cells), seconds=end))
    return Schedule(
        slots=tuple(out), makespan_seconds=max((s.seconds for s in out), default=0.0),
        lower_bound_seconds=lower_bound(groups, builders, times),
        unplaced=tuple(pc.cell.id for g in unplaced for pc in g.cells),
    )

