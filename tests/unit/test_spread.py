"""A plan's ranges come from the recorded runs it drew on (factory.planning.spread)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from factory.cli import main
from factory.matrix.cell import Cell
from factory.planning.memory_model import MemoryHistory
from factory.planning.object_times import RecordedRun
from factory.planning.planner import ObjectReplay, plan_for
from factory.planning.spread import MACHINE_SPREAD, RunCheck, spread
from factory.units import GIB

CELL = Cell(package="demo", version="1.0", torch="2.14.1", cuda="13.0", archs=(100,),
            python="3.11")
SECONDS = {f"o{i}": 100.0 + 10 * i for i in range(8)}
PEAKS = {k: 2 * GIB for k in SECONDS}


def history(runs: list[RecordedRun], *, peaks: bool = True, ooms: int = 0) -> MemoryHistory:
    """The object times measured at 2 jobs on 4 CPUs, with ``runs`` recorded."""
    entry = {"package": "demo", "version": "1.0", "cuda": "13.0", "archs": [100],
             "nvcc_threads": 1, "max_jobs": 2, "cpus": 4, "source": "a log",
             "seconds": SECONDS, "runs": [r.as_dict() for r in runs], "ooms": ooms}
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


def run(jobs: int, cpus: int, *, slower: float, heavier: float,
        supplied_times: bool = False) -> RecordedRun:
    seconds, peak = replayed(jobs, cpus)
    return RecordedRun(source=f"run at {jobs}", date="2026-12-01", max_jobs=jobs, cpus=cpus,
                       compile_seconds=seconds * slower, peak_bytes=int(peak * heavier),
                       machine="a VM", supplied_times=supplied_times)


def plan(h: MemoryHistory, *, cpus: int = 4, memory: int = 16 * GIB):  # type: ignore[no-untyped-def]
    return plan_for(CELL, supports_threads=False, memory_model_key="demo", memory=memory,
                    cpus=cpus, history=h)


def unscaled(cpus: int = 4) -> float:
    """The plan's compile time with no run recorded (speed 1)."""
    p = plan(history([]), cpus=cpus)
    assert p.predicted_seconds is not None
    return p.predicted_seconds


def test_the_range_spans_every_recorded_runs_ratio_and_holds_the_point() -> None:
    runs = [run(2, 2, slower=1.25, heavier=0.8), run(2, 4, slower=0.9, heavier=0.95)]
    p = plan(history(runs))
    assert p.predicted_seconds is not None and p.predicted_seconds_range is not None
    # the times were measured on 4 CPUs, as many as the plan's: their own speed
    assert p.speed_factor == 1.0 and p.predicted_seconds == pytest.approx(unscaled(), abs=0.1)
    lo, hi = p.predicted_seconds_range
    assert lo == pytest.approx(p.predicted_seconds * 0.9, rel=0.01)
    assert hi == pytest.approx(p.predicted_seconds * 1.25, rel=0.01)
    # the peak: the replay x the highest ratio (0.95); the other run sits at 0.8 / 0.95
    plo, phi = p.predicted_peak_range
    assert plo == pytest.approx(p.predicted_peak_bytes * 0.8 / 0.95, rel=0.01)
    assert phi == p.predicted_peak_bytes
    # it says which runs
    assert [c.run.source for c in p.range_runs] == ["run at 2", "run at 2"]
    assert sum(r.startswith("recorded run ") for r in p.reasons) == 2
    assert any("from 2 recorded run(s)" in r and "widened" not in r for r in p.reasons)


def test_the_run_that_supplied_the_times_is_no_evidence() -> None:
    # A run replays its own object times at ratio 1 by construction: with one other run the
    # range is widened as for one run; with two others it is not.
    own = run(2, 4, slower=1.0, heavier=1.0, supplied_times=True)
    p = plan(history([own, run(2, 2, slower=1.1, heavier=1.0)]))
    assert p.predicted_seconds is not None and p.predicted_seconds_range is not None
    lo, hi = p.predicted_seconds_range
    assert hi == pytest.approx(p.predicted_seconds * 1.1 * (1 + MACHINE_SPREAD), rel=0.01)
    assert lo == pytest.approx(p.predicted_seconds / (1 + MACHINE_SPREAD), rel=0.01)
    assert any("1 of them other than the point's own" in r and "widened" in r
               for r in p.reasons)
    assert [c.supplied for c in p.range_runs] == ["object times", ""]
    two = plan(history([own, run(2, 2, slower=1.1, heavier=1.0),
                        run(1, 4, slower=0.95, heavier=1.0)]))
    assert two.predicted_seconds_range == pytest.approx(
        (two.predicted_seconds * 0.95, two.predicted_seconds * 1.1), rel=0.01)
    assert not any("widened" in r for r in two.reasons)


def test_the_speed_is_the_recorded_run_nearest_the_plans_cpus() -> None:
    # Times measured on 4 CPUs; a run on 16 CPUs compiled in half the time they give there.
    # A plan for 16 CPUs takes that run's speed (and the run is then no evidence of it); a
    # plan for 4 CPUs keeps the times' own.
    fast = run(2, 16, slower=0.5, heavier=1.0)
    h = history([fast, run(2, 2, slower=1.2, heavier=1.0)])
    p = plan(h, cpus=16, memory=64 * GIB)
    assert p.speed_factor == pytest.approx(0.5, rel=0.001)
    assert p.predicted_seconds == pytest.approx(0.5 * unscaled(16), rel=0.001)
    assert any("nearest 16 CPU(s)" in r and "0.50x" in r for r in p.reasons)
    assert [c.supplied for c in p.range_runs] == ["speed", ""]
    lo, hi = p.predicted_seconds_range or (0, 0)
    # the 2-CPU run took 1.2x the unscaled model: 2.4x the point; one other run: widened
    assert hi == pytest.approx(p.predicted_seconds * 2.4 * (1 + MACHINE_SPREAD), rel=0.01)
    near = plan(h, cpus=4)
    assert near.speed_factor == 1.0 and near.predicted_seconds == pytest.approx(unscaled(4))


def test_the_peak_factor_never_scales_one_object_nor_past_an_oom() -> None:
    runs = [run(2, 4, slower=1.0, heavier=0.7), run(2, 2, slower=1.0, heavier=0.75)]
    heaviest = max(PEAKS.values())
    beside = history([]).non_compile_bytes("demo")
    # room for one job only: the heaviest object at its full peak, not 0.75 of it
    one = plan(history(runs), memory=heaviest + beside + GIB // 2)
    assert one.max_jobs == 1 and one.predicted_peak_bytes == max(heaviest + beside, GIB)
    two = plan(history(runs))
    assert any("replayed peaks x 0.750" in r for r in two.reasons)
    raw = plan(history([]))
    assert two.predicted_peak_bytes < raw.predicted_peak_bytes
    # an OOM kill raised the peaks: no run talks them down again
    after = plan(history(runs, ooms=1))
    assert after.predicted_peak_bytes == raw.predicted_peak_bytes
    assert not any("replayed peaks x" in r for r in after.reasons)


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


def test_a_run_starved_of_cpus_gives_no_speed_and_no_times() -> None:
    # The same run on 16 CPUs, twice as slow as the times: when its compilers had a CPU 40 %
    # of their time (CPU seconds over span x jobs), it measured other work, not the machine;
    # on a CPU 95 % of it, it is the machine's speed.
    slow = run(2, 16, slower=2.0, heavier=1.0)
    busy = dataclasses.replace(slow, cpu_seconds=0.4 * slow.compile_seconds * 2)
    idle = dataclasses.replace(slow, cpu_seconds=0.95 * slow.compile_seconds * 2)
    assert busy.starved() and not idle.starved()
    assert plan(history([idle]), cpus=16).speed_factor == pytest.approx(2.0, rel=0.001)
    assert plan(history([busy]), cpus=16).speed_factor == 1.0
    # a run's own kept times: passed over when starved, for the record's own (4 CPUs)
    kept = {k: 2 * v for k, v in SECONDS.items()}
    mine = dataclasses.replace(idle, seconds=kept, cpu_seconds=0.95 * sum(kept.values()))
    theirs = dataclasses.replace(mine, cpu_seconds=0.4 * sum(kept.values()))
    assert history([mine]).object_times(CELL, cpus=16).cpus == 16
    assert history([theirs]).object_times(CELL, cpus=16).cpus == 4
    # the record's own times from a starved build: another run's kept times, however far
    own = dataclasses.replace(run(2, 4, slower=1.0, heavier=1.0, supplied_times=True),
                              cpu_seconds=0.4 * sum(SECONDS.values()))
    far = dataclasses.replace(mine, cpus=64)
    assert history([own, far]).object_times(CELL, cpus=4).cpus == 64
    assert history([dataclasses.replace(own, cpu_seconds=None), far]).object_times(
        CELL, cpus=4).cpus == 4
