"""A plan's ranges come from the recorded runs it drew on (factory.planning.spread)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.cli import main
from factory.matrix.cell import Cell
from factory.planning.memory_model import MemoryHistory, RecordedRun
from factory.planning.planner import ObjectReplay, plan_for
from factory.planning.spread import MACHINE_SPREAD, RunCheck, spread
from factory.units import GIB

CELL = Cell(package="demo", version="1.0", torch="2.14.1", cuda="13.0", archs=(100,),
            python="3.11")
SECONDS = {f"o{i}": 100.0 + 10 * i for i in range(8)}
PEAKS = {k: 2 * GIB for k in SECONDS}


def history(runs: list[RecordedRun], *, peaks: bool = True) -> MemoryHistory:
    entry = {"package": "demo", "version": "1.0", "cuda": "13.0", "archs": [100],
             "nvcc_threads": 1, "max_jobs": 2, "cpus": 2, "source": "a log",
             "seconds": SECONDS, "runs": [r.as_dict() for r in runs]}
    if peaks:
        entry["peak_bytes"] = PEAKS
    doc = {"version": 1, "defaults": {"*": {"per_arch_bytes": 2 * GIB,
                                            "headroom_bytes": GIB, "non_compile_bytes": 0}},
           "memory": [], "objects": [entry]}
    return MemoryHistory(doc, path=None)


def replayed(jobs: int, cpus: int) -> tuple[float, int]:
    """What the model replays at a run's jobs and CPUs (the run check's denominator)."""
    h = history([])
    times = h.object_times(CELL)
    objects = ObjectReplay.of(CELL, times, 1)
    assert objects is not None
    r = objects.run(jobs, threads=1, archs=1, cpus=cpus)
    return r.span_seconds, r.peak_bytes


def run(jobs: int, cpus: int, *, slower: float, heavier: float) -> RecordedRun:
    seconds, peak = replayed(jobs, cpus)
    return RecordedRun(source=f"run at {jobs}", date="2026-12-01", max_jobs=jobs, cpus=cpus,
                       compile_seconds=seconds * slower, peak_bytes=int(peak * heavier),
                       machine="a VM")


def plan(h: MemoryHistory):  # type: ignore[no-untyped-def]
    return plan_for(CELL, supports_threads=False, memory_model_key="demo", memory=16 * GIB,
                    cpus=4, history=h)


def test_the_range_spans_every_recorded_runs_ratio_and_holds_the_point() -> None:
    runs = [run(2, 2, slower=1.25, heavier=0.8), run(4, 4, slower=0.9, heavier=0.95)]
    p = plan(history(runs))
    assert p.predicted_seconds is not None and p.predicted_seconds_range is not None
    lo, hi = p.predicted_seconds_range
    assert lo == pytest.approx(p.predicted_seconds * 0.9, rel=0.01)
    assert hi == pytest.approx(p.predicted_seconds * 1.25, rel=0.01)
    plo, phi = p.predicted_peak_range
    assert plo == pytest.approx(p.predicted_peak_bytes * 0.8, rel=0.01)
    assert phi == p.predicted_peak_bytes  # no run was heavier than the model
    # it says which runs
    assert [c.run.source for c in p.range_runs] == ["run at 2", "run at 4"]
    assert sum(r.startswith("recorded run ") for r in p.reasons) == 2
    assert any("from 2 recorded run(s)" in r for r in p.reasons)


def test_one_run_is_widened_by_the_machine_spread() -> None:
    p = plan(history([run(2, 2, slower=1.0, heavier=1.0)]))
    assert p.predicted_seconds is not None and p.predicted_seconds_range is not None
    lo, hi = p.predicted_seconds_range
    assert hi == pytest.approx(p.predicted_seconds * (1 + MACHINE_SPREAD), rel=0.01)
    assert lo == pytest.approx(p.predicted_seconds / (1 + MACHINE_SPREAD), rel=0.01)
    assert any("widened" in r for r in p.reasons)


def test_per_job_peaks_give_the_peak_range_where_no_object_peaks_exist() -> None:
    doc = history([], peaks=False).as_document()
    doc["memory"] = [{"package": "demo", "version": "1.0", "cuda": "13.0",
                      "concurrent_archs": 1, "nvcc_threads": 1,
                      "recent_peaks": [3 * GIB, 2 * GIB], "builds": 2}]
    p = plan(MemoryHistory(doc, path=None))
    lo, hi = p.predicted_peak_range
    assert hi == p.predicted_peak_bytes
    assert lo == p.max_jobs * 2 * GIB + GIB  # every job at the lower recent peak + headroom
    assert any("2 recent peak(s)" in r for r in p.reasons)


def test_no_time_no_time_range() -> None:
    s = spread(None, 5 * GIB, [])
    assert s.seconds is None and s.peak == (5 * GIB, 5 * GIB)


def test_a_run_without_a_peak_gives_no_peak_ratio() -> None:
    r = RecordedRun(source="s", date="d", max_jobs=1, cpus=1, compile_seconds=10.0)
    assert RunCheck(run=r, predicted_seconds=5.0).peak_ratio is None
    assert RunCheck(run=r, predicted_seconds=5.0).seconds_ratio == 2.0


def test_plan_json_carries_the_ranges_and_the_runs(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    # The shipped sm_90 entry holds the repo's real runs built in the factory's order.
    matrix = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "matrix.toml"
    assert main(["plan", "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312", "--matrix",
                 str(matrix), "--memory", "160g", "--cpus", "32", "--history",
                 str(tmp_path / "h.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lo, hi = out["predicted_seconds_range"]
    assert lo <= out["predicted_seconds"] <= hi
    plo, phi = out["predicted_peak_bytes_range"]
    assert plo <= out["predicted_peak_bytes"] <= phi
    assert len(out["range_runs"]) >= 3
    # the 32-job run of 2026-12-01 (559 s, 116.4 GiB of compilers) lies inside both ranges
    assert lo <= 558.8 <= hi and plo <= 125030621184 <= phi


def test_an_oom_re_plan_carries_no_range() -> None:
    from factory.planning.planner import plan_after_oom

    p = plan(history([run(2, 2, slower=1.0, heavier=1.0)]))
    assert p.predicted_seconds_range is not None
    again = plan_after_oom(p, None, 1, history=MemoryHistory.scratch())
    assert again.predicted_seconds_range is None and again.predicted_peak_range is None
    assert again.as_dict()["range_runs"] == []
