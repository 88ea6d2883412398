"""The per-object replay: what runs together at its own size, and contention in time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.matrix.cell import Cell
from factory.planning.history_file import shipped_history_path
from factory.planning.memory_model import BuildMeasurement, MemoryHistory
from factory.planning.planner import ObjectReplay, plan_after_oom, plan_for
from factory.planning.replay import (
    PEAK_WINDOW_SECONDS,
    TAIL_FRACTION,
    contention_factor,
    replay,
)
from factory.units import GIB

SM90 = Cell(package="flash-attn", version="2.8.3.post2", torch="2.11.0", cuda="13.0",
            archs=(90,), python="3.12")


def test_objects_started_together_count_at_their_peaks() -> None:
    r = replay([(300.0, 4 * GIB), (300.0, 3 * GIB), (300.0, 2 * GIB)], jobs=3)
    assert r.peak_bytes == 9 * GIB
    assert r.span_seconds == 300.0


def test_a_later_start_meets_the_others_past_their_front_end() -> None:
    # 2 slots: the third object starts when the short one ends, after the long one's window.
    r = replay([(400.0, 4 * GIB), (100.0, 4 * GIB), (100.0, 4 * GIB)], jobs=2)
    assert PEAK_WINDOW_SECONDS < 100.0
    assert r.peak_bytes == 8 * GIB  # the start, not the later 4 x 0.5 + 4
    assert replay([(400.0, 4 * GIB), (100.0, 1 * GIB), (100.0, 9 * GIB)], jobs=2).peak_bytes \
        == int(4 * GIB * TAIL_FRACTION + 9 * GIB)
    assert r.span_seconds == 400.0


def test_a_later_ninja_run_starts_when_the_run_before_it_has_ended() -> None:
    """setup.py runs ninja once per extension: a run's objects neither start early on a free
    slot nor add their memory to the run before it."""
    objects = [(300.0, 4 * GIB), (100.0, 3 * GIB), (200.0, 5 * GIB)]
    one = replay(objects, jobs=3)
    assert (one.span_seconds, one.peak_bytes) == (300.0, 12 * GIB)
    staged = replay(objects, jobs=3, stages=[0, 0, 1])
    assert staged.span_seconds == 500.0  # 300 s, then the second run's 200 s
    assert staged.peak_bytes == 7 * GIB  # the first run's two at once; the 5 GiB one alone
    # the runs go in their order, whatever order the objects come in
    assert replay(objects, jobs=3, stages=[1, 1, 0]).span_seconds == 500.0
    with pytest.raises(ValueError):
        replay(objects, jobs=3, stages=[0, 1])


def test_an_object_keeps_its_ninja_run_when_the_start_order_changes() -> None:
    """ObjectReplay.in_order (a recorded run's own start order) moves each object's ninja run
    with it."""
    objects = ObjectReplay(objects=((300.0, 4 * GIB), (200.0, 5 * GIB), (100.0, 3 * GIB)),
                           source="t", keys=("a", "b#2", "c"), stages=(0, 1, 0))
    shape = {"threads": 1, "archs": 1, "cpus": 3}  # 3 compiling on 3 CPUs: 14 % slower
    moved = objects.in_order(["c", "b#2", "a"])
    assert moved.keys == ("c", "b#2", "a") and moved.stages == (0, 1, 0)
    for r in (objects.run(3, **shape), moved.run(3, **shape)):
        assert r.span_seconds == pytest.approx(500.0 * 1.14) and r.peak_bytes == 7 * GIB


def test_contention_grows_to_14_percent_then_proportionally() -> None:
    assert contention_factor(1, 16) == pytest.approx(1 + 0.14 / 16)
    assert contention_factor(16, 16) == pytest.approx(1.14)
    assert contention_factor(32, 16) == pytest.approx(2 * 1.14)


def shipped() -> MemoryHistory:
    return MemoryHistory.load(shipped_history_path())


def test_planner_replays_per_object_peaks_where_they_were_measured() -> None:
    # The real 16-job run peaked at 56.25 GiB in this order: 16 jobs fit 64 GiB, where the
    # per-job model (2 x 6.7 + n x 4.2 + 2) allowed 13.
    plan = plan_for(SM90, supports_threads=True, memory_model_key="flash-attn",
                    memory=64 * GIB, cpus=16, history=shipped())
    assert plan.max_jobs == 16
    assert 56 * GIB <= plan.predicted_peak_bytes <= 64 * GIB
    assert any("replay" in r for r in plan.reasons)
    tight = plan_for(SM90, supports_threads=True, memory_model_key="flash-attn",
                     memory=48 * GIB, cpus=16, history=shipped())
    assert tight.predicted_peak_bytes <= 48 * GIB
    assert 9 <= tight.max_jobs < 16


def test_another_arch_falls_back_to_the_per_job_model() -> None:
    sm120 = Cell(package="flash-attn", version="2.8.3.post2", torch="2.11.0", cuda="13.0",
                 archs=(120,), python="3.12")
    plan = plan_for(sm120, supports_threads=True, memory_model_key="flash-attn",
                    memory=64 * GIB, cpus=16, history=shipped())
    assert not any("replay" in r for r in plan.reasons)
    assert plan.max_jobs == 13


def test_the_flagship_cell_plans_from_its_own_sm100_data(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The default matrix's flash-attn sm_100 cell at 64 GiB / 16 CPUs: the sm_100 record's
    # per-object peaks (sampled in the flagship build on the 2-core builder), scaled by the
    # highest measured / replayed ratio of its two recorded runs (0.916, the flagship build),
    # replayed in the start order of the object times measured nearest 16 CPUs (the H200 run
    # of 2026-11-29, 9 jobs on 16 CPUs). The per-job model planned 13 jobs; the unscaled
    # replay in the flagship's order 14.
    from factory.cli import main
    from factory.planning.planner import ObjectReplay, calibration

    cell = Cell.from_id("flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311")
    h = shipped()
    times = h.object_times(cell, cpus=16)
    assert times is not None and times.archs == (100,) and len(times.peaks) == 73
    assert (times.max_jobs, times.cpus) == (9, 16) and "flagship" in times.peaks_from
    assert main(["plan", cell.id, "--memory", "64g", "--cpus", "16", "--history",
                 str(tmp_path / "h.json"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["max_jobs"] == 15
    record = "flash-attn 2.8.3.post2, CUDA 13.0, sm_100 record"
    assert any(f"per-object peaks of the {record}" in r and "flagship" in r
               for r in plan["reasons"])
    assert any(f"object times of the {record}" in r and "sm_100, 9 jobs" in r
               for r in plan["reasons"])
    assert plan["predicted_peak_bytes"] <= 64 * GIB
    # 15 is exactly what the calibrated replay lets fit: 16 would not
    cal = calibration(cell, h, cpus=16, model_key="flash-attn")
    # the flagship build: compilers 12.05 GiB measured, 13.16 GiB replayed in its own order
    assert cal.peak_factor == pytest.approx(0.9155, abs=0.001)
    objects = ObjectReplay.of(cell, times, 1, peak_factor=cal.peak_factor)
    assert objects is not None
    beside = h.non_compile_bytes("flash-attn")
    fit, _ = objects.jobs_that_fit(64 * GIB, headroom=beside, most=16, threads=1, archs=1,
                                   cpus=16)
    assert fit == 15
    sixteen = objects.run(16, threads=1, archs=1, cpus=16)
    assert objects.peak(sixteen) + beside > 64 * GIB
    # the time: the H200 run's object times on 16 CPUs as they are, about 11 min
    assert plan["speed_factor"] == 1.0 and 600 < plan["predicted_seconds"] < 700
    # its range: the H200 run supplied the times (no evidence), the flagship build is the
    # one other run (1.54x the model on its 2 CPUs): widened by the 14 % of two VMs
    runs = {r["max_jobs"]: r for r in plan["range_runs"]}
    assert set(runs) == {2, 9}
    assert runs[9]["supplied"] == "object times" and runs[2]["supplied"] is None
    lo, hi = plan["predicted_seconds_range"]
    assert hi > 1.5 * plan["predicted_seconds"] and lo < plan["predicted_seconds"] / 1.1
    # at 2 CPUs the flagship build's own times: its own machine
    two = h.object_times(cell, cpus=2)
    assert two is not None and two.cpus == 2 and "flagship" in two.source


def test_an_oom_raises_the_object_peaks_so_the_next_plan_is_no_bolder(tmp_path: Path) -> None:
    history = MemoryHistory.load(tmp_path / "h.json")
    plan = plan_for(SM90, supports_threads=True, memory_model_key="flash-attn",
                    memory=64 * GIB, cpus=16, history=history)
    retry = plan_after_oom(plan, 64 * GIB, 1, history=history)
    again = plan_for(SM90, supports_threads=True, memory_model_key="flash-attn",
                     memory=64 * GIB, cpus=16, history=MemoryHistory.load(tmp_path / "h.json"))
    assert again.max_jobs <= retry.max_jobs < plan.max_jobs


def test_recorded_object_peaks_keep_the_largest_seen(tmp_path: Path) -> None:
    history = MemoryHistory.load(tmp_path / "h.json")
    cell = Cell(package="x", version="1", torch="2.11.0", cuda="13.0", archs=(90,),
                python="3.12")
    for peaks in ({"a": 3 * GIB, "b": 1 * GIB}, {"a": 2 * GIB}):
        history.record(BuildMeasurement(cell=cell, nvcc_threads=1, max_jobs=2, cpus=4,
                                        peak_job_bytes=None, object_seconds={"a": 10.0},
                                        object_peaks=peaks))
    times = MemoryHistory.load(tmp_path / "h.json").object_times(cell)
    assert times is not None
    assert dict(times.peaks) == {"a": 3 * GIB, "b": 1 * GIB}
    assert (times.max_jobs, times.cpus) == (2, 4)


def test_a_build_that_failed_before_any_object_finished_leaves_a_plannable_history(
    tmp_path: Path,
) -> None:
    """Peaks sampled but no object seconds (seen on the GPU machine: a build that stopped at
    its first compile error); the next plan falls back to the per-job model."""
    history = MemoryHistory.load(tmp_path / "h.json")
    history.record(BuildMeasurement(cell=SM90, nvcc_threads=1, max_jobs=16, cpus=16,
                                    peak_job_bytes=None, object_seconds={},
                                    object_peaks={"flash_fwd_hdim64_fp16_sm80": GIB}))
    plan = plan_for(SM90, supports_threads=True, memory_model_key="flash-attn",
                    memory=64 * GIB, cpus=16, history=MemoryHistory.load(tmp_path / "h.json"))
    assert plan.max_jobs >= 1
    assert not any("replay" in r for r in plan.reasons)


def test_the_sampler_names_a_compile_job_by_its_output() -> None:
    import subprocess
    import sys

    from factory.runners.inside.sampling import output_of as _output_of

    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code, "-o", "build/temp/x.o"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        assert _output_of(child.pid) == "build/temp/x.o"
    finally:
        child.communicate(b"")
    assert _output_of(child.pid) is None  # gone: no name, no error
