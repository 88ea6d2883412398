"""From one cell to the whole matrix: which builder builds which cells, in what order.

Cells that share compiled objects (same package, version, torch, CUDA, arch set and platform;
any Python) form a group and go to one builder slot in sequence, so every cell after the first
takes its kernels from the compile cache (docs/BENCHMARKS.md "Compile cache": a second Python
version's compile is 10 % of the first for the bundled extension, 0-3 % for flash-attn's
kernels; the 10 % is used). Groups go whole to builders (``assign``): longest first (by CPU
work) to the builder whose predicted end grows least, then an iterated local search of moves
and swaps; where the groups fall into few kinds, the exact best count of each kind per builder.
Two lower bounds come with the schedule: ``lower_bound`` (fluid: work over all CPUs) and
``group_bound`` (whole groups on memory-capped builders; the proof is in its docstring).

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
import functools
import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from factory.errors import ConfigError, PlanError
from factory.matrix.load import PlannedCell
from factory.matrix.tags import wheel_platform
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import plan_for
from factory.planning.replay import contention_factor
from factory.tomlread import tomllib
from factory.toolchain.cross import can_build
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
        return can_build(builder=self.platform, target=_machine(plat))


@functools.cache
def _machine(plat: str) -> str:
    """The CPU a wheel's platform tag names, parsed once per tag: the search asks per move."""
    return wheel_platform([plat])


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


def shared_span(cpus: int, lanes: Sequence[Sequence[Phase]],
                phase_ends: list[list[float]] | None = None) -> list[float]:
    """When each lane ends, with the lanes running side by side on ``cpus`` CPUs.

    The CPUs are shared out evenly among the running phases, none getting more than its cap
    (what oversubscribed compilers do: a finished cell's CPUs go to the others). Returns the
    end time of each lane; ``phase_ends`` (given empty) gets each lane's phase end times."""
    if phase_ends is not None:
        phase_ends[:] = [[] for _ in lanes]
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
                if phase_ends is not None:
                    phase_ends[i].append(now)
                pos[i] += 1
                done[i] = 0.0
                if pos[i] == len(lanes[i]):
                    ends[i] = now


def _lanes(b: Builder, groups: Sequence[Group], times: CellTimes
           ) -> tuple[int, list[list[Group]], list[float]] | None:
    """Run ``groups`` on builder ``b`` in the number of lanes side by side that ends first
    (each cell planned with memory / lanes and all the CPUs: more lanes keep the CPUs busy,
    fewer give each cell more jobs). Per lane count, longest first onto the least loaded
    lane, by CPU work and by time alone (the two differ where memory caps a group's jobs);
    then, for the best lane count, moves and swaps off the lane that ends last while they
    help. Returns (lanes, groups per lane, end per lane), or None when not even one lane
    fits a group."""
    best: tuple[int, list[list[Group]], list[float]] | None = None
    for k in range(1, min(len(groups), MAX_LANES) + 1):
        phases = {g.key: times.phases(g, b.memory_bytes // k, b.cpus) for g in groups}
        if any(p is None for p in phases.values()):
            continue
        tried: list[list[list[Group]]] = []
        for by_time in (False, True):
            load = {key: sum(p.work / (min(p.cap, b.cpus) if by_time else 1.0)
                             for p in ps or ()) for key, ps in phases.items()}
            lanes: list[list[Group]] = [[] for _ in range(k)]
            filled = [0.0] * k
            # ties by phases, not by input order: groups alike here are interchangeable, so
            # the lanes' ends depend only on the multiset (what ``_Spans`` remembers)
            for g in sorted(groups, key=lambda g: (-load[g.key], [
                    (p.work, p.parallel, p.longest) for p in phases[g.key] or ()])):
                i = filled.index(min(filled))
                lanes[i].append(g)
                filled[i] += load[g.key]
            if lanes in tried:
                continue
            tried.append(lanes)
            ends = _run(b, lanes, phases)
            if best is None or max(ends) < max(best[2]):
                best = (k, lanes, ends)
    return None if best is None else _balance(b, best, times)


def _run(b: Builder, lanes: Sequence[Sequence[Group]],
         phases: Mapping[tuple[str, ...], Sequence[Phase] | None]) -> list[float]:
    return shared_span(b.cpus, [[p for g in lane for p in phases[g.key] or ()]
                                for lane in lanes])


def _balance(b: Builder, found: tuple[int, list[list[Group]], list[float]],
             times: CellTimes, rounds: int = 8) -> tuple[int, list[list[Group]], list[float]]:
    """Move a group off the lane that ends last to another lane (never emptying it), or
    swap it for another lane's group, while the ends (longest first) improve."""
    k, lanes, ends = found
    phases = {g.key: times.phases(g, b.memory_bytes // k, b.cpus) for lane in lanes
              for g in lane}
    for _ in range(rounds):
        last = max(range(k), key=lambda i: ends[i])
        rank = sorted(ends, reverse=True)
        better: tuple[list[list[Group]], list[float]] | None = None
        for g, j in itertools.product(lanes[last], range(k)):
            if j == last:
                continue
            for h in [None, *lanes[j]]:
                if h is None and len(lanes[last]) == 1:
                    continue
                trial = [list(lane) for lane in lanes]
                if h is None:  # move g to the end of lane j
                    trial[last].remove(g)
                    trial[j].append(g)
                else:  # swap g and h, each taking the other's place
                    trial[last][trial[last].index(g)] = h
                    trial[j][trial[j].index(h)] = g
                new = _run(b, trial, phases)
                if sorted(new, reverse=True) < rank:
                    better = (trial, new)
                    break
            if better:
                break
        if better is None:
            break
        lanes, ends = better
    return k, lanes, ends


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
    lower_bound_seconds: float  # the fluid bound (``lower_bound``)
    group_bound_seconds: float  # the whole-group bound (``group_bound``), never below it
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
                   f"whole groups {self.group_bound_seconds / 60:.0f} min, fluid "
                   f"{self.lower_bound_seconds / 60:.0f} min)")
        out += [f"unplaced: {c} (no builder has its platform or the memory)"
                for c in self.unplaced]
        return out


def lower_bound(groups: Sequence[Group], builders: Sequence[Builder],
                times: CellTimes) -> float:
    """The fluid bound: max(all groups' CPU work / all CPUs, the longest group alone on the
    builder where it is fastest). CPU work: the group's phases at one CPU (the cache effect
    and the overheads included); nothing a schedule does shrinks it. Loose: it lets a group's
    work flow over every builder's CPUs, and ignores that memory limits how many compilers a
    builder runs at once; ``group_bound`` is the one for whole groups."""
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """A group at one lane share of one builder, as the bound sees it."""

    work: float  # CPU-seconds of all its phases
    chain: float  # its time alone: every phase at min(cap, CPUs), one after another
    rate: float  # the most CPUs it uses at once: its largest phase cap, at most the CPUs

    @staticmethod
    def of(phases: Sequence[Phase], cpus: int) -> Profile:
        caps = [max(1e-9, min(p.cap, float(cpus))) for p in phases]
        return Profile(work=sum(p.work for p in phases),
                       chain=sum(p.work / c for p, c in zip(phases, caps, strict=True)),
                       rate=max(caps))


# A kind: per builder None (does not build it) or per lane count k (1..) its Profile, None
# where the planner refuses it at memory / k. Groups of one kind are interchangeable.
Kind = tuple[tuple[Profile | None, ...] | None, ...]
BOUND_TRANSITIONS = 2_000_000  # the exact search's size before kinds are merged


def _merge(a: Kind, b: Kind) -> Kind:
    """A kind no costlier than either: allowed where either is, the smaller work and chain,
    the larger rate."""
    def one(x: Profile | None, y: Profile | None) -> Profile | None:
        if x is None or y is None:
            return x or y
        return Profile(work=min(x.work, y.work), chain=min(x.chain, y.chain),
                       rate=max(x.rate, y.rate))

    return tuple(pa or pb if pa is None or pb is None
                 else tuple(one(x, y) for x, y in zip(pa, pb, strict=True))
                 for pa, pb in zip(a, b, strict=True))


def _size(kind: Kind) -> float:
    return max((p.work for per in kind if per for p in per if p), default=0.0)


def _builder_bound(per_kind: Sequence[tuple[Profile | None, ...] | None],
                   counts: Sequence[int], cpus: int) -> float:
    """No way of running ``counts`` groups of each kind on one builder ends sooner (see
    ``group_bound``); inf when no lane count fits them all."""
    n = sum(counts)
    if n == 0:
        return 0.0
    best = math.inf
    for k in range(1, min(n, MAX_LANES) + 1):
        profs: list[tuple[Profile, int]] = []
        for per, c in zip(per_kind, counts, strict=True):
            p = per[k - 1] if c and per else None
            if c and p is None:
                break  # the planner refuses one of them at memory / k
            if p is not None:
                profs.append((p, c))
        else:
            best = min(best, _lanes_bound(profs, n, k, cpus))
    return best


def _lanes_bound(profs: Sequence[tuple[Profile, int]], n: int, k: int, cpus: int) -> float:
    """(a) to (d) of ``group_bound`` for ``n`` groups (count per profile) in k lanes."""
    work = sum(p.work * c for p, c in profs)
    rate = min(float(cpus), k * max(p.rate for p, _ in profs))
    chains = sorted((p.chain, c) for p, c in profs)
    need, queue = math.ceil(n / k), 0.0
    for chain, c in chains:
        take = min(c, need)
        queue += take * chain
        need -= take
        if not need:
            break
    lanes = sum(chain * c for chain, c in chains) / k
    return max(work / rate, chains[-1][0], queue, lanes)


def group_bound(groups: Sequence[Group], builders: Sequence[Builder], times: CellTimes,
                *, transitions: int = BOUND_TRANSITIONS) -> float:
    """A lower bound on the makespan of every schedule the factory's model allows.

    The model (what ``schedule`` chooses among): each group whole on one builder that builds
    its platform; a builder runs its groups in k lanes, 1 <= k <= min(its groups, MAX_LANES),
    each lane's cells planned at memory // k and all the CPUs, a lane's groups one after
    another, the lanes side by side as ``shared_span`` runs them. For a builder b with the
    set S in k lanes, every phase (``CellTimes.phases`` at memory // k) runs at most at its
    cap and all of them together at most on the CPUs. So:

    (a) no lane runs faster than the largest cap r among S's phases and at most k lanes run,
        so the builder does at most min(CPUs, k r) CPU-seconds per second, and all of S's
        work W must be done: span >= W / min(CPUs, k r). Where memory binds (few jobs per
        lane) this is well above W / CPUs;
    (b) a group's phases run one after another, each at most at min(cap, CPUs): span >= the
        longest such chain in S;
    (c) k lanes hold |S| groups, so one lane holds at least ceil(|S| / k) of them in
        sequence: span >= the sum of the ceil(|S| / k) shortest chains in S;
    (d) a lane takes at least the sum of its groups' chains, so the k lanes together take
        at least the sum of all chains in S and the longest at least 1 / k of it: span >=
        sum of chains / k. Where memory caps a group's jobs its chain is long, and this is
        well above (a), which lets another lane use the CPUs it leaves.

    span(b, S) >= LB(b, S) = min over the k b could choose of max(a, b, c, d), and the makespan
    of any schedule >= max over builders of LB(b, S_b) >= the minimum of that over every
    assignment of whole groups to builders. That minimum is computed exactly, by dynamic
    programming over builders and the number of groups of each kind (groups with the same
    profile everywhere are interchangeable) left to place. Where that search would exceed
    ``transitions``, the two most alike kinds are merged into one no costlier than either
    (the smaller work and chain, the larger rate, allowed wherever either is); LB only
    shrinks, and every assignment of the real groups is one of the merged problem, so the
    result is still a bound, only a looser one. Groups that no builder takes are left out,
    as ``schedule`` leaves them unplaced.

    It is a bound of the model, not of real builds: the cache effect, the planner's jobs per
    memory share and the overheads are the model's figures."""
    lane_counts = range(1, min(len(groups), MAX_LANES) + 1)
    kinds: dict[Kind, int] = {}
    for g in groups:
        kind: Kind = tuple(
            tuple(None if (p := times.phases(g, b.memory_bytes // k, b.cpus)) is None
                  else Profile.of(p, b.cpus) for k in lane_counts)
            if b.builds(g.platform) else None for b in builders)
        if any(per and any(per) for per in kind):
            kinds[kind] = kinds.get(kind, 0) + 1
    pool = sorted(kinds.items(), key=lambda kv: _size(kv[0]))

    def cost(pool: Sequence[tuple[Kind, int]]) -> int:
        return len(builders) * math.prod((n + 1) * (n + 2) // 2 for _, n in pool)

    while len(pool) > 1 and cost(pool) > transitions:
        i = min(range(len(pool) - 1),
                key=lambda i: _size(pool[i + 1][0]) / max(1e-9, _size(pool[i][0])))
        (a, na), (b, nb) = pool[i], pool[i + 1]
        pool[i:i + 2] = [(_merge(a, b), na + nb)]
    shapes = [k for k, _ in pool]
    memo: dict[tuple[int, tuple[int, ...]], float] = {}
    alone: dict[tuple[int, tuple[int, ...]], float] = {}  # one builder's bound for a take

    def best(i: int, left: tuple[int, ...]) -> float:
        if i == len(builders):
            return 0.0 if not any(left) else math.inf
        if (i, left) in memo:
            return memo[(i, left)]
        per_kind = [k[i] for k in shapes]
        ranges = [range(n + 1) if per is not None else range(1)
                  for n, per in zip(left, per_kind, strict=True)]
        found = math.inf
        for take in itertools.product(*ranges):
            if (i, take) not in alone:
                alone[(i, take)] = _builder_bound(per_kind, take, builders[i].cpus)
            here = alone[(i, take)]
            if here >= found:
                continue
            rest = best(i + 1, tuple(n - t for n, t in zip(left, take, strict=True)))
            found = min(found, max(here, rest))
        memo[(i, left)] = found
        return found

    found = best(0, tuple(n for _, n in pool))
    return max(found if math.isfinite(found) else 0.0, _rate_bound(kinds, builders))


def _rate_bound(kinds: Mapping[Kind, int], builders: Sequence[Builder]) -> float:
    """(a) over all builders at once, for when the exact search had to merge kinds: builder
    b never does more than max over k of min(CPUs, k x the largest cap at memory // k)
    CPU-seconds per second, and each group does at least its least work anywhere; no group
    ends before its shortest chain anywhere."""
    rate = 0.0
    for i, b in enumerate(builders):
        caps: dict[int, float] = {}  # lane count: the largest cap of any kind there
        for kind in kinds:
            for k, p in enumerate(kind[i] or (), start=1):
                if p is not None:
                    caps[k] = max(caps.get(k, 0.0), p.rate)
        rate += max((min(float(b.cpus), k * r) for k, r in caps.items()), default=0.0)
    work = chain = 0.0
    for kind, n in kinds.items():
        profs = [p for per in kind if per for p in per if p is not None]
        work += n * min(p.work for p in profs)
        chain = max(chain, min(p.chain for p in profs))
    return max(work / rate if rate else 0.0, chain)


EXACT_SPANS = 1000  # builder spans the exact search over kinds may simulate
SEARCH_SPANS = 4000  # builder spans the local search may simulate
KICKS = 60  # restarts of the local search from a perturbed best assignment


class _Spans:
    """A builder's predicted end for a multiset of group kinds (groups with the same phases
    everywhere are interchangeable), simulated once and remembered."""

    def __init__(self, groups: Sequence[Group], builders: Sequence[Builder],
                 times: CellTimes) -> None:
        self.builders = {b.name: b for b in builders}
        self.times = times
        lane_counts = range(1, min(len(groups), MAX_LANES) + 1)
        ids: dict[tuple[Any, ...], int] = {}
        self.kind: dict[tuple[str, ...], int] = {}
        for g in groups:
            sig = tuple((b.builds(g.platform), tuple(
                None if (p := times.phases(g, b.memory_bytes // k, b.cpus)) is None
                else tuple(p) for k in lane_counts)) for b in builders)
            self.kind[g.key] = ids.setdefault(sig, len(ids))
        self.simulated = 0
        self._memo: dict[tuple[str, tuple[int, ...]], float] = {}

    def key(self, groups: Iterable[Group]) -> tuple[int, ...]:
        return tuple(sorted(self.kind[g.key] for g in groups))

    def end(self, builder: str, groups: Sequence[Group]) -> float:
        """inf where the builder cannot run them all (platform or memory)."""
        b = self.builders[builder]
        if not groups:
            return 0.0
        if not all(b.builds(g.platform) for g in groups):
            return math.inf
        memo = (builder, self.key(groups))
        if memo not in self._memo:
            self.simulated += 1
            found = _lanes(b, groups, self.times)
            self._memo[memo] = math.inf if found is None else max(found[2])
        return self._memo[memo]


def _rank(ends: Mapping[str, float]) -> tuple[float, ...]:
    """Makespan first, then the next longest builders: a move that shortens the second
    longest builder is progress too (it frees room to shorten the longest next)."""
    return tuple(sorted(ends.values(), reverse=True))


def _greedy(groups: Sequence[Group], builders: Sequence[Builder], spans: _Spans
            ) -> tuple[dict[str, list[Group]], list[Group]]:
    """Longest group first (its most CPU work on any builder that takes it), each onto the
    builder where the makespan, then its own end, grows least."""
    given: dict[str, list[Group]] = {b.name: [] for b in builders}
    ends = {b.name: 0.0 for b in builders}
    unplaced: list[Group] = []

    def size(g: Group) -> float:
        works = [w for b in builders if b.builds(g.platform)
                 if (w := spans.times.work(g, b.memory_bytes, 1)) is not None]
        return max(works, default=0.0)

    for g in sorted(groups, key=size, reverse=True):
        best: tuple[float, float, str] | None = None
        for b in builders:
            end = spans.end(b.name, given[b.name] + [g])
            if math.isinf(end):
                continue
            rank = (max(end, *ends.values()), end, b.name)
            if best is None or rank < best:
                best = rank
        if best is None:
            unplaced.append(g)
            continue
        given[best[2]].append(g)
        ends[best[2]] = best[1]
    return given, unplaced


def _local_search(given: dict[str, list[Group]], spans: _Spans, budget: int) -> None:
    """Move one group to another builder, or swap two groups of different kinds between two
    builders, whenever that lowers ``_rank`` (longest builders first); first improvement,
    until no move helps or ``budget`` spans were simulated."""
    ends = {n: spans.end(n, gs) for n, gs in given.items()}
    start = spans.simulated
    improved = True
    while improved and spans.simulated - start < budget:
        improved = False
        rank = _rank(ends)
        for worst in sorted(ends, key=lambda n: -ends[n]):
            for g, other in itertools.product(list(given[worst]), list(given)):
                if other == worst or g not in given[worst]:
                    continue
                back: list[Group | None] = [None, *given[other]]
                for h in back:
                    if h is not None and spans.kind[h.key] == spans.kind[g.key]:
                        continue
                    mine = [x for x in given[worst] if x is not g] + ([h] if h else [])
                    theirs = [x for x in given[other] if x is not h] + [g]
                    new = {**ends, worst: spans.end(worst, mine),
                           other: spans.end(other, theirs)}
                    if _rank(new) < rank:
                        given[worst], given[other] = mine, theirs
                        ends.update(new)
                        improved = True
                        break
                if improved or spans.simulated - start >= budget:
                    break
            if improved or spans.simulated - start >= budget:
                break


def _iterated_search(given: dict[str, list[Group]], spans: _Spans, budget: int,
                     kicks: int = KICKS) -> None:
    """``_local_search``, then from the best assignment so far: move two random groups (one
    off the builder that ends last) to random builders that build them and search again,
    keeping the result when it ranks better. A single move or swap cannot leave a state
    where every neighbour is longer (giving a builder one more group costs it a lane's
    memory share); two at once often can. Seeded: the same input gives the same schedule."""
    rng = random.Random(0)
    start = spans.simulated
    _local_search(given, spans, budget)

    def rank(a: Mapping[str, Sequence[Group]]) -> tuple[float, ...]:
        return _rank({n: spans.end(n, gs) for n, gs in a.items()})

    best, best_rank = {n: list(gs) for n, gs in given.items()}, rank(given)
    for _ in range(kicks if sum(map(len, given.values())) > 1 else 0):
        left = budget - (spans.simulated - start)
        if left <= 0:
            break
        trial = {n: list(gs) for n, gs in best.items()}
        for src in (max(trial, key=lambda n: spans.end(n, trial[n])),
                    rng.choice([n for n in trial if trial[n]])):
            if not trial[src]:
                continue
            g = rng.choice(trial[src])
            to = [n for n in trial if n != src and spans.builders[n].builds(g.platform)]
            if to:
                trial[src].remove(g)
                trial[rng.choice(to)].append(g)
        _local_search(trial, spans, left)
        if (r := rank(trial)) < best_rank:
            best, best_rank = trial, r
    given.update(best)


def _exact(groups: Sequence[Group], builders: Sequence[Builder], spans: _Spans,
           budget: int) -> dict[str, list[Group]] | None:
    """The best assignment of whole groups (each builder running its share as ``_lanes``
    packs it), by dynamic programming over builders and the number of groups of each kind
    left; None when that would simulate more than ``budget`` builder spans."""
    pools: dict[int, list[Group]] = {}
    for g in groups:
        pools.setdefault(spans.kind[g.key], []).append(g)
    kinds = sorted(pools)
    if len(builders) * math.prod(len(pools[k]) + 1 for k in kinds) > budget:
        return None
    memo: dict[tuple[int, tuple[int, ...]], tuple[float, tuple[tuple[int, ...], ...]]] = {}

    def chosen(take: tuple[int, ...], left: tuple[int, ...]) -> list[Group]:
        return [g for k, t, n in zip(kinds, take, left, strict=True)
                for g in pools[k][len(pools[k]) - n:][:t]]

    def best(i: int, left: tuple[int, ...]) -> tuple[float, tuple[tuple[int, ...], ...]]:
        if i == len(builders):
            return (0.0 if not any(left) else math.inf), ()
        if (i, left) not in memo:
            found: tuple[float, tuple[tuple[int, ...], ...]] = (math.inf, ())
            for take in itertools.product(*(range(n + 1) for n in left)):
                here = spans.end(builders[i].name, [
                    g for k, t in zip(kinds, take, strict=True) for g in pools[k][:t]])
                if here >= found[0]:
                    continue
                rest, plan = best(i + 1, tuple(n - t for n, t in zip(left, take, strict=True)))
                if max(here, rest) < found[0]:
                    found = (max(here, rest), (take, *plan))
            memo[(i, left)] = found
        return memo[(i, left)]

    span, plan = best(0, tuple(len(pools[k]) for k in kinds))
    if math.isinf(span):
        return None
    given: dict[str, list[Group]] = {}
    left = tuple(len(pools[k]) for k in kinds)
    for b, take in zip(builders, plan, strict=True):
        given[b.name] = chosen(take, left)
        left = tuple(n - t for n, t in zip(left, take, strict=True))
    return given


def assign(groups: Sequence[Group], builders: Sequence[Builder], times: CellTimes, *,
           exact_spans: int = EXACT_SPANS, search_spans: int = SEARCH_SPANS
           ) -> tuple[dict[str, list[Group]], list[Group]]:
    """Whole groups to builders: longest first to the builder whose end grows least, then
    moves and swaps while they shorten the longest builders; where the groups fall into few
    kinds, also the exact best over how many groups of each kind each builder gets. The
    better of the two (by ``_rank``). Returns (groups per builder, groups none can take)."""
    spans = _Spans(groups, builders, times)
    given, unplaced = _greedy(groups, builders, spans)
    _iterated_search(given, spans, search_spans)
    out = {g.key for g in unplaced}
    placed = [g for g in groups if g.key not in out]
    exact = _exact(placed, builders, spans, exact_spans) if exact_spans else None
    if exact is not None and _rank({n: spans.end(n, gs) for n, gs in exact.items()}) < _rank(
            {n: spans.end(n, gs) for n, gs in given.items()}):
        given = exact
    return given, unplaced


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
