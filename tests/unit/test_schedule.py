"""factory schedule: groups sharing kernels go to one slot in sequence, longest first."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from factory.cli import main
from factory.errors import ConfigError
from factory.matrix.load import PlannedCell, load_matrix
from factory.planning.memory_model import MemoryHistory, shipped_history_path
from factory.planning.schedule import (
    Builder,
    builders_from,
    group_cells,
    platform_of,
    schedule,
)
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
    assert doc["makespan_seconds"] >= doc["lower_bound_seconds"] > 0
    assert all(set(i) == {"builder", "slots"} for i in doc["include"])
