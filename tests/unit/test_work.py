"""The work model every engine reads: groups of shared kernels, longest first, each with the
allocation its plan needs, and the planner inside that allocation making the same plan."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from factory.cli import main
from factory.matrix.load import PlannedCell, load_matrix
from factory.planning.memory_model import MemoryHistory, shipped_history_path
from factory.planning.planner import plan_for
from factory.planning import work as work_module
from factory.planning.groups import group_cells
from factory.planning.planner import BuildPlan
from factory.planning.work import (
    CPU_SLACK,
    MEMORY_ROUND,
    PEAK_SPREAD,
    SECONDS_SPREAD,
    SETUP_ALLOWANCE_SECONDS,
    peak_range,
    plan_group,
    plan_work,
    seconds_factors,
    work_group,
)
from factory.units import GIB

MATRIX = """
[axes]
torch = ["2.13.0", "2.14.1"]
cuda = ["13.0"]
archs = [["9.0"], ["10.0"], ["9.0", "10.0"]]
python = ["3.11", "3.12"]

[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]

[packages.factory-example-ext]
recipe = "torch-extension"
versions = ["0.1.0"]
source = "tests/example_ext"
"""


@pytest.fixture(scope="module")
def cells() -> list[PlannedCell]:
    return list(load_matrix(text=MATRIX).cells)


def write_matrix(directory: Path) -> Path:
    example = Path(__file__).resolve().parents[1] / "example_ext"
    path = directory / "matrix.toml"
    path.write_text(MATRIX.replace('"tests/example_ext"', f'"{example}"'))
    return path


def history() -> MemoryHistory:
    return MemoryHistory.load(shipped_history_path())


def test_groups_share_kernels_and_run_longest_first(cells: list[PlannedCell]) -> None:
    work = plan_work(cells, memory=256 * GIB, cpus=64, history=history())
    assert len(work.groups) == 12 and not work.refused  # 2 packages x 2 torch x 3 arch sets
    assert sorted(c for g in work.groups for c in g.cells) == sorted(pc.cell.id for pc in cells)
    for g in work.groups:
        first = g.planned[0].cell
        assert [pc.cell.python for pc in g.planned] == ["3.11", "3.12"]  # any Python, in order
        assert {(pc.cell.package, pc.cell.torch, pc.cell.archs) for pc in g.planned} == {
            (first.package, first.torch, first.archs)}
    points = [g.predicted_seconds for g in work.groups]
    assert points == sorted(points, reverse=True)
    assert work.groups[0].planned[0].cell.package == "flash-attn"
    # the shortest: sm_100 flash-attn on 40 CPUs from the H200 run's object times (the
    # example extension's were measured on a loaded 2-core host)
    assert work.groups[-1].planned[0].cell.archs == (100,)


def test_a_groups_allocation_is_the_top_of_the_planners_ranges(
        cells: list[PlannedCell]) -> None:
    """--mem / requests from the top of the planner's own peak range, --time from the top of
    its time range (its compile range over its point, times the group's time), not fixed
    spreads around its points."""
    h = history()
    widths: set[float] = set()
    for memory, cpus in ((256 * GIB, 64), (64 * GIB, 16), (12 * GIB, 4)):
        work = plan_work(cells, memory=memory, cpus=cpus, history=h)
        for g in work.groups:
            assert g.memory_bytes <= memory and 1 <= g.cpus <= cpus
            # inside the allocation the planner reads its limits and makes the same plan
            pc = g.planned[0]
            inside = plan_for(pc.cell, supports_threads=pc.recipe.supports_threads(),
                              memory_model_key=pc.recipe.memory_model_key or pc.recipe.name,
                              memory=g.memory_bytes, cpus=g.cpus, history=h)
            assert (inside.max_jobs, inside.nvcc_threads) == (g.max_jobs, g.nvcc_threads)
            (lo, hi), planned = peak_range(inside)
            assert planned and inside.predicted_peak_range is not None
            assert g.ranges_from == "planner"
            # the planner's range (its width is the chosen option's; the point moves a little
            # with the budget it was planned at), its top rounded up is what is asked for
            assert g.peak_bytes[1] / g.peak_bytes[0] == pytest.approx(hi / lo, rel=1e-6)
            assert g.memory_bytes == min(memory, math.ceil(g.peak_bytes[1] / MEMORY_ROUND)
                                         * MEMORY_ROUND)
            assert hi <= g.memory_bytes  # the top of the range inside fits it
            factors, planned = seconds_factors(inside)
            assert planned and factors[0] <= 1 <= factors[1]
            assert g.seconds == pytest.approx(tuple(g.predicted_seconds * f for f in factors),
                                              rel=1e-3)  # the planner rounds to 0.1 s
            assert g.time_limit_seconds == g.seconds[1] + SETUP_ALLOWANCE_SECONDS
            # and its CPUs are the ones that plan keeps busy
            assert g.cpus == g.max_jobs * min(g.nvcc_threads, len(pc.cell.archs))
            widths.add(round(g.peak_bytes[1] / g.peak_bytes[0], 3))
    # the planner's widths (the example's point alone; flash-attn's from its recorded runs),
    # never the fixed spread's
    assert 1.0 in widths and len(widths) > 1
    assert round(PEAK_SPREAD[1] / PEAK_SPREAD[0], 3) not in widths


def test_a_plan_without_ranges_takes_the_fixed_spreads(
        cells: list[PlannedCell], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the planner gives no range (a re-plan after an OOM; no object times for the
    package), the fixed spreads around its points stand in, and the group says so."""
    h = history()
    g = next(g for g in group_cells(cells) if g.name.startswith("flash-attn"))

    def bare(*args: Any, **kw: Any) -> BuildPlan:
        return dataclasses.replace(plan_group(*args, **kw), predicted_peak_range=None,
                                   predicted_seconds_range=None)

    monkeypatch.setattr(work_module, "plan_group", bare)
    w = work_group(g, memory=64 * GIB, cpus=16, history=h)
    plan = bare(g, memory=64 * GIB, cpus=16, history=h)
    assert w.ranges_from == "fixed spread for the peak and time"
    assert w.peak_bytes[1] / w.peak_bytes[0] == pytest.approx(PEAK_SPREAD[1] / PEAK_SPREAD[0],
                                                              rel=1e-6)
    assert peak_range(plan) == ((int(plan.predicted_peak_bytes * PEAK_SPREAD[0]),
                                 int(plan.predicted_peak_bytes * PEAK_SPREAD[1])), False)
    assert w.peak_bytes[1] <= w.memory_bytes <= 64 * GIB
    assert w.seconds == pytest.approx(tuple(w.predicted_seconds * f for f in SECONDS_SPREAD))


def test_a_group_no_allocation_fits_is_refused_with_the_planners_reason(
        cells: list[PlannedCell]) -> None:
    work = plan_work(cells, memory=int(4.5 * GIB), cpus=8, history=history())
    refused = {r.name for r in work.refused}
    assert refused and all(n.startswith("flash-attn") for n in refused)
    assert all(g.planned[0].cell.package == "factory-example-ext" for g in work.groups)
    assert all("needs at least" in r.reason and "\n" not in r.reason for r in work.refused)


def test_a_worker_plans_at_its_own_memory_not_below_it(cells: list[PlannedCell]) -> None:
    h = history()
    g = next(g for g in group_cells(cells)
             if g.name.startswith("flash-attn") and "-sm90-" in g.name)
    one = plan_group(g, memory=12 * GIB, cpus=1, history=h)
    (_, top), planned = peak_range(one)
    assert planned and top > one.predicted_peak_bytes
    # between one job's predicted peak and the top of its range: a build there plans one job,
    # an allocation of that size cannot hold the range's top (and no smaller plan exists)
    memory = (one.predicted_peak_bytes + top) // 2
    asked = plan_work(g.cells, memory=memory, cpus=1, history=h)
    own = plan_work(g.cells, memory=memory, cpus=1, history=h, spread=False)
    assert not asked.groups and asked.refused
    assert "needs at least" in asked.refused[0].reason
    assert own.groups and not own.refused and own.groups[0].max_jobs == 1


def test_cli_prints_the_work_and_its_json(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    write_matrix(tmp_path)
    args = ["schedule", "--matrix", str(tmp_path / "matrix.toml"), "--memory", "64g",
            "--cpus", "16"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "12 group(s) of 24 cell(s), longest first" in text
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == 1 and doc["allocation"] == {"memory_bytes": 64 * GIB, "cpus": 16}
    g = doc["groups"][0]
    assert set(g) >= {"id", "cells", "cpus", "memory_bytes", "predicted_seconds_range",
                      "predicted_peak_bytes_range", "time_limit_seconds", "machine"}
    assert g["predicted_seconds_range"][0] < g["predicted_seconds"] < \
        g["predicted_seconds_range"][1]


@pytest.mark.parametrize("extra,message", [
    ([], "give --builders FILE, or --memory SIZE and --cpus N"),
    (["--memory", "8g"], "give --builders FILE, or --memory SIZE and --cpus N"),
    (["--memory", "8g", "--cpus", "0"], "--cpus must be at least 1"),
    (["--memory", "lots", "--cpus", "2"], "unparseable --memory"),
    (["--memory", "8g", "--cpus", "2", "--emit", "slurm"], "give --out DIR"),
    (["--memory", "8g", "--cpus", "2", "--emit", "actions", "--out", "x"], "--builders"),
    (["--memory", "8g", "--cpus", "2", "--emit", "kubernetes", "--out", "x"], "--image"),
    (["--memory", "8g", "--cpus", "2", "--submit"], "--submit goes with --emit slurm"),
    (["--memory", "8g", "--cpus", "2", "--apply"], "--apply goes with --emit kubernetes"),
])
def test_bad_schedule_arguments_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             extra: list[str], message: str) -> None:
    write_matrix(tmp_path)
    rc = main(["schedule", "--matrix", str(tmp_path / "matrix.toml"), *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and len(err.strip().splitlines()) <= 2  # ERROR (and a TIP)


def test_a_groups_id_stays_while_its_cells_are_published(cells: list[PlannedCell]) -> None:
    """A queue worker's lease and a queued job's name follow the group's kernels, not which
    of its cells are still missing (else a second worker takes a half-built group)."""
    whole = {g.name: g.id for g in plan_work(cells, memory=64 * GIB, cpus=16,
                                             history=history()).groups}
    rest = [pc for pc in cells if pc.cell.python != "3.11"]
    half = {g.name: g.id for g in plan_work(rest, memory=64 * GIB, cpus=16,
                                            history=history()).groups}
    assert half == whole and len(set(whole.values())) == len(whole)


def test_an_allocation_takes_the_fewest_cpus_that_keep_its_time(cells: list[PlannedCell]) -> None:
    """Past the longest object more CPUs buy nothing: flash-attn at 512 GiB / 128 CPUs asks
    for about the 38-42 cores one cell scales to, not one per object."""
    h = history()
    wide = plan_work(cells, memory=512 * GIB, cpus=128, history=h, spread=False)
    narrow = plan_work(cells, memory=512 * GIB, cpus=128, history=h)
    by_name = {g.name: g for g in wide.groups}
    saved = 0
    for g in narrow.groups:
        w = by_name[g.name]
        assert g.cpus <= w.cpus
        assert g.predicted_seconds <= w.predicted_seconds * (1 + CPU_SLACK) + 1e-6
        if g.cpus > 1:  # one CPU fewer is slower than the slack allows
            fewer = work_group(g.group, memory=512 * GIB, cpus=g.cpus - 1, history=h)
            assert fewer.predicted_seconds > w.predicted_seconds * (1 + CPU_SLACK)
        saved += w.cpus - g.cpus
    # sm_90: the H200 runs' object times (FIELD-NOTES: one cell scales to about 38-42 cores);
    # sm_100's entry is the 2-core flagship build's, whose longest objects bound the cell sooner
    flash = [g for g in narrow.groups if g.name.startswith("flash-attn") and "-sm90-" in g.name]
    assert flash and all(30 <= g.cpus <= 48 for g in flash)
    assert saved > 0
