"""A 48-cell flash-attn matrix on the repo's builders: `factory schedule` against today's nightly.

Matrix: flash-attn 2.8.3.post2, torch 2.11/2.12/2.13/2.14, CUDA 13.0, Python 3.11/3.12/3.13,
arch sets sm_90 and sm_100, two platforms (manylinux_2_28 and manylinux_2_36 images: their
kernels are not shared, docs/BENCHMARKS.md "Compile cache"). Builders: .github/builders.toml as
the repo configures it (64/128/256/512 GiB with 16/32/64/128 CPUs, labels included).
``--wide``: arch sets sm_90, sm_100, sm_90+sm_100 and sm_80 (96 cells; sm_80's object times are
the nearest history entry's) and two more builders of 96 and 192 GiB with 24 and 48 CPUs.

Cell times come from one model for both policies, the one `factory plan` uses too
(factory.planning.cell_model): the planner's predicted compile at the slot's memory and CPUs
from the shipped history exactly as the factory reads it (sm_90: the H200 host's object times;
sm_100: the flagship build's, at the speed of the recorded run nearest the slot's CPUs, the
H200 run of 2026-11-29: factory.planning.spread.calibrate), contention included; a later
Python version of a group compiles
CACHED_FRACTION (10 %, measured) of the first; every cell adds the recipe's measured overhead
(the median of the real runs in the shipped history).

  factory schedule  groups (same kernels, any Python) to builders (factory.planning.assign
                    .assign: longest first, an iterated local search, and the exact best
                    count of each kind of group per builder where the kinds are few), each
                    builder's groups in the lane count that ends first
  today's nightly   one Actions job per cell in id order, max-parallel 8, the static label per
                    package (factory.ci.PACKAGE_LABELS: flash-attn -> mem-256g), on every builder
                    of .github/builders.toml that carries it (there: builder-256g and
                    builder-512g); each job has the whole builder; the builder's local compile
                    cache serves a later Python version only when the same builder built the
                    group's first cell before it
  policy-family bound  factory.planning.bounds.group_bound: a bound for the factory's own
                    family of policies (whole groups, a builder's lanes at memory / k), with
                    each builder's rate limited by the jobs its memory allows (see its
                    docstring for the proof); computed exactly here (no kinds merged)
  fluid bound       factory.planning.bounds.lower_bound, for every policy: max(all groups'
                    CPU work / all CPUs, the longest single cell on its fastest builder)
  best whole groups every way to give each builder a number of groups of each kind, each
                    builder running its share as `factory schedule` runs it (an enumeration
                    independent of the scheduler's own exact search)

    python benchmarks/replay_matrix.py          # the 48-cell matrix on 4 builders
    python benchmarks/replay_matrix.py --wide   # 96 cells (4 arch sets) on 6 builders
    python benchmarks/replay_matrix.py --wide --exact   # and its best whole-group assignment
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.ci import PACKAGE_LABELS  # noqa: E402
from factory.matrix.load import PlannedCell, load_matrix  # noqa: E402
from factory.planning.assign import _exact, _Spans  # noqa: E402
from factory.planning.builders import Builder, load_builders  # noqa: E402
from factory.planning.cell_times import (  # noqa: E402
    CACHED_FRACTION,
    CellTimes,
    shared_span,
)
from factory.planning.groups import Group, group_cells, platform_of  # noqa: E402
from factory.planning.history_file import shipped_history_path  # noqa: E402
from factory.planning.lanes import _lanes  # noqa: E402
from factory.planning.memory_model import MemoryHistory  # noqa: E402
from factory.planning.schedule import schedule  # noqa: E402
from factory.units import GIB  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MATRIX = """
[axes]
torch = ["2.11.0", "2.12.0", "2.13.0", "2.14.1"]
cuda = ["13.0"]
archs = [["9.0"], ["10.0"]]
python = ["3.11", "3.12", "3.13"]

[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]
"""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_36_x86_64")
BUILDERS = load_builders(ROOT / ".github" / "builders.toml")  # as the repo configures them
STATIC_LABEL = PACKAGE_LABELS["flash-attn"]  # what today's nightly puts on every flash-attn job
MAX_PARALLEL = 8  # nightly.yml's strategy before the schedule


WIDE_ARCHS = 'archs = [["9.0"], ["10.0"], ["9.0", "10.0"], ["8.0"]]'
WIDE_BUILDERS = BUILDERS + tuple(
    Builder(name=f"builder-{m}g", memory_bytes=m * GIB, cpus=c, platform="x86_64")
    for m, c in ((96, 24), (192, 48)))


def cells(*, wide: bool = False) -> list[PlannedCell]:
    text = MATRIX.replace('archs = [["9.0"], ["10.0"]]', WIDE_ARCHS) if wide else MATRIX
    base = list(load_matrix(text=text).cells)
    return [dataclasses.replace(pc, wheel=pc.wheel.replace(platform_of(pc), plat))
            for plat in PLATFORMS for pc in base]


def history() -> MemoryHistory:
    """The shipped history, exactly what the factory plans from (nothing substituted)."""
    return MemoryHistory.load(shipped_history_path())


def nightly(all_cells: list[PlannedCell], times: CellTimes,
            builders: tuple[Builder, ...] = BUILDERS) -> float:
    """Per-cell jobs in id order on the runners carrying the static label (one job each)."""
    runners = [b for b in builders if STATIC_LABEL in b.labels]
    free = {b.name: 0.0 for b in runners}
    seen: dict[str, set[tuple[str, ...]]] = {b.name: set() for b in runners}
    groups = {pc.cell.id + platform_of(pc): g.key for g in group_cells(all_cells)
              for pc in g.cells}
    order = sorted(all_cells, key=lambda pc: (pc.cell.id, platform_of(pc)))
    running: list[float] = []  # end times of the jobs in flight (max-parallel)
    end = 0.0
    for pc in order:
        b = min(runners, key=lambda r: free[r.name])
        start = free[b.name]
        running = sorted(t for t in running if t > start)
        if len(running) >= MAX_PARALLEL:
            start = max(start, running[-MAX_PARALLEL])
        compile_phase = times.compile(pc, b.memory_bytes, b.cpus)
        assert compile_phase is not None
        key = groups[pc.cell.id + platform_of(pc)]
        if key in seen[b.name]:  # the builder's local compile cache has the kernels
            compile_phase = dataclasses.replace(
                compile_phase, work=compile_phase.work * CACHED_FRACTION,
                longest=compile_phase.longest * CACHED_FRACTION)
        took = shared_span(b.cpus, [[compile_phase, times.overhead(pc)]])[0]
        seen[b.name].add(key)
        free[b.name] = start + took
        running.append(start + took)
        end = max(end, start + took)
    return end


def best_whole_groups(groups: list[Group], times: CellTimes) -> float:
    """The best makespan over EVERY way to put whole groups on builders (exhaustive over how
    many groups of each kind each builder gets; groups of one kind are alike here), each
    builder running its groups as `factory schedule` runs them."""
    kinds: dict[tuple[str, ...], list[Group]] = {}
    for g in groups:
        kinds.setdefault((g.cells[0].cell.archs.__repr__(), g.platform), []).append(g)
    pools = list(kinds.values())
    memo: dict[tuple[str, tuple[int, ...]], float] = {}

    def end(b: Builder, counts: tuple[int, ...]) -> float:
        key = (b.name, counts)
        if key not in memo:
            chosen = [g for pool, n in zip(pools, counts, strict=True) for g in pool[:n]]
            found = _lanes(b, chosen, times) if chosen else None
            memo[key] = max(found[2]) if found else (0.0 if not chosen else float("inf"))
        return memo[key]

    def splits(total: int, parts: int) -> list[tuple[int, ...]]:
        if parts == 1:
            return [(total,)]
        return [(i, *rest) for i in range(total + 1) for rest in splits(total - i, parts - 1)]

    per_kind = [splits(len(pool), len(BUILDERS)) for pool in pools]
    best = float("inf")
    for combo in itertools.product(*per_kind):
        span = max(end(b, tuple(c[i] for c in combo)) for i, b in enumerate(BUILDERS))
        best = min(best, span)
    return best


def main(argv: list[str]) -> int:
    wide = "--wide" in argv
    builders = WIDE_BUILDERS if wide else BUILDERS
    all_cells = cells(wide=wide)
    h = history()
    times = CellTimes(h)
    found = schedule(all_cells, builders, history=h)
    today = nightly(all_cells, times, builders)
    groups = group_cells(all_cells)
    print(f"{len(all_cells)} cells in {len(groups)} groups (same kernels, any Python); "
          f"builders: " + ", ".join(f"{b.name} ({b.memory_bytes // GIB} GiB, {b.cpus} CPUs)"
                                    for b in builders))
    print()
    runners = [b.name for b in builders if STATIC_LABEL in b.labels]
    print(f"today's nightly runs every cell on the builders labelled {STATIC_LABEL}: "
          + ", ".join(runners))
    print()
    print("| policy | makespan h | min | vs today's nightly | vs policy-family bound "
          "| vs fluid bound (every policy) |")
    print("|---|---:|---:|---:|---:|---:|")
    fluid, bound = found.lower_bound_seconds, found.group_bound_seconds
    searched = schedule(all_cells, builders, history=h, exact_spans=0)
    rows = [("today's nightly (per-cell jobs, id order, max-parallel 8, "
             f"label {STATIC_LABEL})", today),
            ("`factory schedule`, greedy + local search alone (exact_spans=0)",
             searched.makespan_seconds),
            ("`factory schedule`", found.makespan_seconds)]
    if not wide:  # too many assignments to enumerate for the wide matrix
        rows.append(("best assignment of whole groups (exhaustive)",
                     best_whole_groups(list(groups), times)))
    elif "--exact" in argv:  # the scheduler's own search by kind, unbounded (half an hour)
        spans = _Spans(groups, builders, times)
        best = _exact(list(groups), builders, spans, budget=10**9)
        assert best is not None
        rows.append(("best assignment of whole groups (exact search by kind)",
                     max(spans.end(n, gs) for n, gs in best.items())))
    rows += [("policy-family bound (`group_bound`: whole groups in lanes)", bound),
             ("fluid bound (`lower_bound`, every policy: work / all CPUs, longest cell)",
              fluid)]
    for name, span in rows:
        print(f"| {name} | {span / 3600:.3f} | {span / 60:.1f} | {today / span:.2f}x shorter "
              f"| {100 * (span / bound - 1):+.2f} % | {100 * (span / fluid - 1):+.2f} % |")
    print()
    print("| builder | lanes (cells at once) | memory GiB per lane (CPUs shared) | cells "
          "| busy h |")
    print("|---|---:|---|---:|---:|")
    for b in builders:
        slots = [s for s in found.slots if s.builder == b.name]
        used = [s for s in slots if s.cells]
        if not slots:
            continue
        print(f"| {b.name} | {len(slots)} | {slots[0].memory_bytes / GIB:.0f} "
              f"| {sum(len(s.cells) for s in used)} | "
              f"{max((s.seconds for s in used), default=0) / 3600:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
