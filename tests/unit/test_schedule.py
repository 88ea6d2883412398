"""factory schedule: groups sharing kernels go to one slot in sequence, longest first."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.cli import main
from factory.errors import ConfigError
from factory.matrix.load import PlannedCell, load_matrix
from factory.planning.assign import assign
from factory.planning.bounds import group_bound, lower_bound
from factory.planning.builders import Builder, builders_from
from factory.planning.cell_model import CELL_OVERHEAD_SECONDS
from factory.planning.cell_times import CellTimes, Phase, overhead, shared_span
from factory.planning.groups import Group, group_cells, platform_of
from factory.planning.lanes import MAX_LANES, _lanes
from factory.planning.history_file import shipped_history_path
from factory.planning.memory_model import MemoryHistory
from factory.planning.schedule import schedule
from factory.units import GIB

MATRIX = """
[axes]
torch = ["2.13.0", "2.14.1"]
cuda = ["13.0"]
archs = [["9.0"], ["10.0"]]
python = ["3.11", "3.12", "3.13"]

[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]
"""

BUILDERS = """
[[builder]]
name = "small"
memory = "64g"
cpus = 16
platform = "x86_64"

[[builder]]
name = "big"
memory = "256g"
cpus = 64
platform = "x86_64"
labels = ["gpu-build"]
"""


@pytest.fixture(scope="module")
def cells() -> list[PlannedCell]:
    return list(load_matrix(text=MATRIX).cells)


def history() -> MemoryHistory:
    return MemoryHistory.load(shipped_history_path())


def two() -> tuple[Builder, ...]:
    return (Builder(name="small", memory_bytes=64 * GIB, cpus=16, platform="x86_64"),
            Builder(name="big", memory_bytes=256 * GIB, cpus=64, platform="x86_64"))


def test_cells_sharing_kernels_form_one_group_in_python_order(cells) -> None:  # type: ignore[no-untyped-def]
    groups = group_cells(cells)
    assert len(groups) == 4  # 2 torch x 2 arch sets
    for g in groups:
        assert [pc.cell.python for pc in g.cells] == ["3.11", "3.12", "3.13"]
        assert len({(pc.cell.torch, pc.cell.archs) for pc in g.cells}) == 1


def test_a_group_stays_on_one_slot_in_sequence(cells) -> None:  # type: ignore[no-untyped-def]
    found = schedule(cells, two(), history=history())
    placed = [c for s in found.slots for c in s.cells]
    assert sorted(placed) == sorted(pc.cell.id for pc in cells)
    assert not found.unplaced
    for g in group_cells(cells):
        ids = [pc.cell.id for pc in g.cells]
        holders = [s for s in found.slots if ids[0] in s.cells]
        assert len(holders) == 1
        order = list(holders[0].cells)
        assert order[order.index(ids[0]):order.index(ids[0]) + 3] == ids
    # the builders' memory is shared by their slots, never counted twice
    for b in two():
        assert sum(s.memory_bytes for s in found.slots if s.builder == b.name) <= b.memory_bytes
        assert all(s.cpus == b.cpus for s in found.slots if s.builder == b.name)  # shared
    assert found.lower_bound_seconds <= found.makespan_seconds


def test_a_cell_goes_only_to_a_builder_of_its_platform(cells) -> None:  # type: ignore[no-untyped-def]
    arm = (Builder(name="arm", memory_bytes=512 * GIB, cpus=64, platform="aarch64"),)
    found = schedule(cells, arm, history=history())
    assert sorted(found.unplaced) == sorted(pc.cell.id for pc in cells)
    other = [dataclasses.replace(pc, cell=dataclasses.replace(pc.cell, platform="aarch64"),
                                 wheel=pc.wheel.replace(platform_of(pc), "manylinux_2_28_aarch64"))
             for pc in cells[:3]]
    arm_ids = {pc.cell.id for pc in other}
    mixed = schedule(list(cells) + other, two() + arm, history=history())
    arm_cells = {c for s in mixed.slots if s.builder == "arm" for c in s.cells}
    assert arm_cells and arm_cells <= arm_ids
    assert not mixed.unplaced
    # x86_64 builders cross-build aarch64 cells (factory.toolchain.cross); not the reverse
    x86_only = schedule(list(cells) + other, two(), history=history())
    assert not x86_only.unplaced
    assert arm_ids <= {c for s in x86_only.slots for c in s.cells}


def test_later_python_versions_are_cheaper_than_the_first(cells) -> None:  # type: ignore[no-untyped-def]
    one_group = group_cells(cells)[0].cells
    single = schedule(one_group[:1], two()[1:], history=history())
    triple = schedule(one_group, two()[1:], history=history())
    assert triple.makespan_seconds < 2 * single.makespan_seconds


def test_builders_file_errors_are_one_line() -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        builders_from([{"name": "a", "memory": "8g", "cpus": 2, "gpus": 1}])
    with pytest.raises(ConfigError, match="lacks"):
        builders_from([{"name": "a", "cpus": 2}])
    with pytest.raises(ConfigError, match="unique"):
        builders_from([{"name": "a", "memory": "8g", "cpus": 2}] * 2)


def test_cli_schedule_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "matrix.toml").write_text(MATRIX)
    (tmp_path / "builders.toml").write_text(BUILDERS)
    rc = main(["schedule", "--matrix", str(tmp_path / "matrix.toml"), "--builders",
               str(tmp_path / "builders.toml"), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == 1
    assert {b["name"] for b in doc["builders"]} <= {"small", "big"}
    assert sum(len(s["cells"]) for b in doc["builders"] for s in b["slots"]) == 12
    assert doc["makespan_seconds"] >= doc["group_bound_seconds"] >= doc["lower_bound_seconds"] > 0
    assert all(set(i) == {"builder", "slots"} for i in doc["include"])


# --- the whole-group bound and the assignment, on small random instances -------------------
# A synthetic model behind the same interface (CellTimes.compile): each package's first cell is
# ``work`` CPU-seconds, never shorter than ``longest``, one job per ``job`` bytes of the lane's
# memory (refused below one job); some packages' work grows with the jobs (as an unknown
# package's does). Small enough that every schedule of the model can be tried.

X86 = "manylinux_2_28_x86_64"
ARM = "manylinux_2_28_aarch64"


class FakeTimes(CellTimes):
    def __init__(self, spec: dict[str, tuple[float, float, int, float]]) -> None:
        super().__init__(history())
        self.spec = spec

    def compile(self, pc: Any, memory: int, cpus: int, *,
                machine_cpus: int | None = None) -> Phase | None:
        """``pc``: a fake cell, "PACKAGE/GROUP/N" (no machine speed: ``machine_cpus`` unused)."""
        work, longest, job, grow = self.spec[pc.split("/")[0]]
        jobs = min(cpus, memory // job)
        if jobs < 1:
            return None
        return Phase(work=work * (1 + grow * jobs), parallel=jobs, longest=longest)

    def overhead(self, pc: Any) -> Phase:
        return overhead()  # a fake cell has no recipe: the default overhead


def instance(seed: int, n_groups: int, n_builders: int) -> tuple[
        list[Group], tuple[Builder, ...], FakeTimes]:
    rng = random.Random(seed)
    builders = tuple(
        Builder(name=f"b{i}", memory_bytes=rng.choice((8, 16, 32, 64)) * GIB,
                cpus=rng.choice((2, 4, 8, 16)),
                platform="aarch64" if i and rng.random() < 0.25 else "x86_64")
        for i in range(n_builders))
    spec: dict[str, tuple[float, float, int, float]] = {}
    groups = []
    for i in range(n_groups):
        name = f"p{i % max(2, n_groups - 1)}"  # some groups alike, as torch versions are
        spec.setdefault(name, (rng.uniform(200, 4000), rng.uniform(20, 300),
                               rng.choice((1, 2, 4, 6)) * GIB, rng.choice((0.0, 0.0, 0.05))))
        plat = ARM if rng.random() < 0.2 else X86
        cells = tuple(f"{name}/{i}/{j}" for j in range(rng.randint(1, 3)))
        groups.append(Group(key=(name, str(i), plat), cells=cells))  # type: ignore[arg-type]
    return groups, builders, times_of(spec)


def times_of(spec: dict[str, tuple[float, float, int, float]]) -> FakeTimes:
    return FakeTimes(spec)


def lane_orders(groups: list[Group], k: int) -> Iterator[list[list[Group]]]:
    """Every way to run ``groups`` in at most ``k`` lanes, each lane in every order."""
    if not groups:
        yield []
        return
    first, rest = groups[0], groups[1:]
    for lanes in lane_orders(rest, k):
        for i, lane in enumerate(lanes):
            for at in range(len(lane) + 1):
                yield [*lanes[:i], lane[:at] + [first] + lane[at:], *lanes[i + 1:]]
        if len(lanes) < k:
            yield [*lanes, [first]]


def builder_optimum(b: Builder, groups: list[Group], times: CellTimes) -> float:
    """The shortest end of ``groups`` on ``b`` over every lane count, partition and order."""
    if not groups:
        return 0.0
    best = math.inf
    for k in range(1, min(len(groups), MAX_LANES) + 1):
        phases = {g.key: times.phases(g, b.memory_bytes // k, b.cpus) for g in groups}
        if any(p is None for p in phases.values()):
            continue
        for lanes in lane_orders(groups, k):
            ends = shared_span(b.cpus, [[p for g in lane for p in phases[g.key] or ()]
                                        for lane in lanes])
            best = min(best, max(ends))
    return best


def every_assignment(groups: list[Group], builders: tuple[Builder, ...]) -> Iterator[
        dict[str, list[Group]]]:
    for where in itertools.product(range(len(builders)), repeat=len(groups)):
        if all(builders[w].builds(g.platform) for g, w in zip(groups, where, strict=True)):
            yield {b.name: [g for g, w in zip(groups, where, strict=True) if w == i]
                   for i, b in enumerate(builders)}


def placeable(groups: list[Group], builders: tuple[Builder, ...], times: CellTimes
              ) -> list[Group]:
    return [g for g in groups if any(b.builds(g.platform) and times.phases(
        g, b.memory_bytes, b.cpus) is not None for b in builders)]


SHAPES = [(seed, 2 + seed % 4, 1 + seed % 3) for seed in range(36)]


def placed_instance(seed: int, n_groups: int, n_builders: int) -> tuple[
        list[Group], tuple[Builder, ...], FakeTimes]:
    """An instance without the groups no builder takes (``schedule`` leaves them unplaced)."""
    groups, builders, times = instance(seed, n_groups, n_builders)
    groups = placeable(groups, builders, times)
    assert groups
    return groups, builders, times


@pytest.mark.parametrize(("seed", "n_groups", "n_builders"), SHAPES)
def test_the_whole_group_bound_never_exceeds_the_model_optimum(
        seed: int, n_groups: int, n_builders: int) -> None:
    groups, builders, times = placed_instance(seed, n_groups, n_builders)
    memo: dict[tuple[str, tuple[str, ...]], float] = {}

    def end(b: Builder, gs: list[Group]) -> float:
        key = (b.name, tuple(g.key[1] for g in gs))
        if key not in memo:
            memo[key] = builder_optimum(b, gs, times)
        return memo[key]

    optimum = min(max(end(b, a[b.name]) for b in builders)
                  for a in every_assignment(groups, builders))
    bound = group_bound(groups, builders, times)
    merged = group_bound(groups, builders, times, transitions=1)  # every kind merged into one
    assert 0 < merged <= bound <= optimum * (1 + 1e-9)
    assert lower_bound(groups, builders, times) <= optimum * (1 + 1e-9)
    # the factory's schedule is one of the model's: never below its optimum, and (these
    # instances, measured) within 5 % of it
    given, unplaced = assign(groups, builders, times)
    assert not unplaced
    assert max(end(b, given[b.name]) for b in builders) >= optimum * (1 - 1e-9)
    assert optimum <= max(_lanes_end(b, given[b.name], times) for b in builders) <= 1.05 * optimum


@pytest.mark.parametrize(("seed", "n_groups", "n_builders"), SHAPES)
def test_assign_finds_the_best_whole_group_assignment(
        seed: int, n_groups: int, n_builders: int) -> None:
    groups, builders, times = placed_instance(seed, n_groups, n_builders)

    def makespan(a: dict[str, list[Group]]) -> float:
        return max(_lanes_end(b, a[b.name], times) for b in builders)

    best = min(makespan(a) for a in every_assignment(groups, builders))
    exact, _ = assign(groups, builders, times)
    assert makespan(exact) == pytest.approx(best)
    searched, _ = assign(groups, builders, times, exact_spans=0)  # greedy + local search only
    assert makespan(searched) >= best * (1 - 1e-9)
    assert all(b.builds(g.platform) for b in builders for g in searched[b.name])
    assert sorted(g.key for gs in searched.values() for g in gs) == sorted(g.key for g in groups)


def _lanes_end(b: Builder, groups: list[Group], times: CellTimes) -> float:
    if not groups:
        return 0.0
    found = _lanes(b, groups, times)
    return math.inf if found is None else max(found[2])


def test_the_bound_sees_memory_bind_where_the_fluid_bound_does_not() -> None:
    # 4 groups of 1000 CPU-s whose jobs need 8 GiB, on one 16 GiB builder with 16 CPUs: at
    # most 2 jobs at once whatever the lanes, so >= 4000 / 2 s; the fluid bound sees all 16
    # CPUs and one group alone (1000 / 2 s and its overhead).
    groups = [Group(key=("p", str(i), X86), cells=(f"p/{i}/0",))  # type: ignore[arg-type]
              for i in range(4)]
    builders = (Builder(name="b", memory_bytes=16 * GIB, cpus=16, platform="x86_64"),)
    times = times_of({"p": (1000.0, 10.0, 8 * GIB, 0.0)})
    assert lower_bound(groups, builders, times) == pytest.approx(
        max(4 * (1000.0 + CELL_OVERHEAD_SECONDS) / 16, 1000.0 / 2 + CELL_OVERHEAD_SECONDS))
    bound = group_bound(groups, builders, times)
    assert bound >= 4 * 1000.0 / 2
    assert bound <= builder_optimum(builders[0], groups, times)


def test_the_replay_matrix_is_scheduled_within_15_percent_of_the_whole_group_bound() -> None:
    # issue 18's goal on a 24-cell flash-attn matrix (shipped history) over four builders of
    # 64-512 GiB: the factory's assignment, and its local search alone
    text = MATRIX.replace('["2.13.0", "2.14.1"]', '["2.11.0", "2.12.0", "2.13.0", "2.14.1"]')
    cells = list(load_matrix(text=text).cells)
    builders = tuple(Builder(name=f"b{m}", memory_bytes=m * GIB, cpus=c, platform="x86_64")
                     for m, c in ((64, 16), (128, 32), (256, 64), (512, 128)))
    for exact_spans in (0, 1000):
        found = schedule(cells, builders, history=history(), exact_spans=exact_spans)
        assert found.group_bound_seconds <= found.makespan_seconds
        assert found.makespan_seconds <= 1.15 * found.group_bound_seconds
        # memory binds on these builders: the fluid bound is far below what any schedule does
        assert found.group_bound_seconds > 1.2 * found.lower_bound_seconds


def test_a_builders_end_depends_on_its_groups_not_their_order() -> None:
    # assign remembers a builder's end by the groups it runs; five groups of equal work but
    # other caps and memory (ties in the longest-first packing) once gave two ends
    times = times_of({f"p{i}": (1000.0, longest, job * GIB, 0.0) for i, (longest, job) in
                      enumerate(((100.0, 2), (20.0, 3), (100.0, 1), (600.0, 2), (20.0, 3)))})
    groups = [Group(key=(f"p{i}", str(i), X86),  # type: ignore[arg-type]
                    cells=tuple(f"p{i}/{i}/{j}" for j in range(1 + i % 2))) for i in range(5)]
    b = Builder(name="b", memory_bytes=8 * GIB, cpus=4, platform="x86_64")
    ends = {_lanes_end(b, list(order), times) for order in itertools.permutations(groups)}
    assert len(ends) == 1
