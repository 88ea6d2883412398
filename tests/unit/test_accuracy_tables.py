"""The accuracy tables in docs/BENCHMARKS.md predict each run only from the runs before it
(benchmarks/replay_real_runs.py): nothing of the predicted run's own goes in."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import replay_real_runs as rr  # noqa: E402


def _scaled_log(src: Path, dst: Path, factor: float) -> Path:
    out = []
    for line in src.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            out.append(line)
            continue
        f = line.split("\t")
        f[0], f[1] = str(int(int(f[0]) * factor)), str(int(int(f[1]) * factor))
        out.append("\t".join(f))
    dst.write_text("\n".join(out) + "\n")
    return dst


def _real() -> rr.Run:
    return next(r for r in rr.RUNS if r.log == rr.LF)  # 16 jobs, longest first


def test_a_run_twice_as_slow_is_predicted_from_the_run_before_it(tmp_path: Path) -> None:
    # The same build with every time doubled: a prediction from the earlier run alone is
    # about half of it. The old script rescaled by the predicted run's own sum of times and
    # reported about 0 % here.
    a = dataclasses.replace(_real(), order=1)
    b = dataclasses.replace(a, order=2, name="synthetic 2x",
                            log=_scaled_log(a.log, tmp_path / "slow.ninja_log", 2.0))
    rows = rr.predict([a, b])
    assert rows[1].span_from is a
    assert rows[1].span_error == pytest.approx(-0.5, abs=0.05)
    assert rows[1].span_errors == (rows[1].span_error,)


def test_the_first_run_has_no_prediction_and_order_decides_not_the_list(tmp_path: Path) -> None:
    a = dataclasses.replace(_real(), order=2)
    b = dataclasses.replace(a, order=1, name="earlier, 2x",
                            log=_scaled_log(a.log, tmp_path / "slow.ninja_log", 2.0))
    rows = rr.predict([a, b])  # listed out of order: b happened first
    assert [r.run.order for r in rows] == [1, 2]
    assert rows[0].predicted_span is None and rows[0].span_errors == ()
    assert rows[1].span_error == pytest.approx(1.0, abs=0.1)  # predicted from the slow one


def test_the_fit_inputs_are_marked_in_sample_and_the_others_are_not() -> None:
    rows = rr.predict(rr.RUNS)
    fitted = {r.run.order for r in rows if r.in_sample}
    assert fitted == {r.order for r in rr.RUNS if r.fit_input}
    # every real run in the repo is a row, the 32-job run of 2026-12-01 included
    assert rr.SM90_32 in {r.run.log for r in rows}
    assert len(rows) == len(rr.RUNS)


def test_the_memory_bound_is_below_every_schedule_that_fits_the_cap() -> None:
    # The bound of simulate_schedule.py against two kinds of schedule under the same replay
    # model, on seeded random instances: the memory-aware dispatcher and fixed jobs in LPT
    # order (where their replayed peak fits the cap).
    import random

    import simulate_schedule as ss

    from factory.planning.replay import contention_factor, replay
    from factory.units import GIB

    rng = random.Random(7)
    for _ in range(40):
        n = rng.randint(3, 25)
        seconds = {f"o{i}": rng.uniform(20, 500) for i in range(n)}
        peaks = {k: int(rng.uniform(0.5, 6) * GIB) for k in seconds}
        cores = rng.choice([1, 2, 4, 8, 16])
        cap = int(rng.uniform(7, 40) * GIB)
        bound = ss.memory_bound(seconds, peaks, cap, cores, 0)
        order = sorted(seconds, key=lambda k: -seconds[k])
        assert ss.memory_aware(seconds, peaks, order, cap, cores, 0) >= bound - 1e-6
        alone = ss.fastest(seconds, cores)
        for jobs in range(1, min(cores, n) + 1):
            f = contention_factor(jobs, cores) / contention_factor(1, cores)
            r = replay([(alone[k] * f, peaks[k]) for k in order], jobs)
            if r.peak_bytes <= cap:
                assert r.span_seconds >= bound - 1e-6


def test_the_best_packing_is_a_packing_no_longer_than_lpt() -> None:
    import random

    import simulate_schedule as ss

    from factory.planning.replay import list_schedule

    rng = random.Random(3)
    for _ in range(30):
        d = [rng.uniform(1, 100) for _ in range(rng.randint(2, 40))]
        slots = rng.randint(1, 8)
        best = ss.best_packing(d, slots)
        assert max(sum(d) / slots, max(d)) - 1e-6 <= best
        assert best <= list_schedule(sorted(d, reverse=True), slots) + 1e-6


def test_todays_model_agrees_with_every_real_fit_and_oom() -> None:
    # Every real run under a cap in the repo (two OOM kills among them) against the planner's
    # replay as it counts it now (calibrated by the records' runs): no verdict may be wrong,
    # and the rows whose own figures are in the model say so.
    from factory.planning.history_file import shipped_history_path
    from factory.planning.memory_model import MemoryHistory

    rows = rr.fits_table(MemoryHistory.load(shipped_history_path()))[2:]
    assert len(rows) == 8
    assert sum("OOM-killed" in r for r in rows) == 2
    assert all(r.rstrip(" |").split("| ")[-1].startswith("yes") for r in rows)
    # both flagship builds are in the shipped record: the rebuild's object times, each object's
    # larger peak of the two, both runs' peaks in the calibration
    first, again = [r for r in rows if "2 jobs, torch 2.14.1" in r]
    assert "2026-12-01" in first and "in-sample: its per-object peaks" in first
    assert "its object times" not in first
    assert "2026-12-02" in again and "in-sample: its object times, its per-object peaks" in again


def test_the_planners_choice_follows_its_rule_for_object_times() -> None:
    """The table's "planner's choice" is the planner's (object_times.nearest_times): the
    nearest CPU count, and not a run starved of CPUs. The flagship's idle rebuild (2 CPUs)
    passes over the loaded first build on the same 2 CPUs (its compilers on a CPU 46 % of
    their time) for the H200 sm_100 run's times; the most recent run, as the table took until
    session 12, would be the loaded one."""
    by_order = {r.order: r for r in rr.RUNS}
    loaded, rebuild = by_order[6], by_order[7]
    assert loaded.record().starved() and not rebuild.record().starved()
    assert rr.planner_times(rebuild, [by_order[i] for i in range(1, 7)]) is by_order[4]
    # among runs alike in load, the nearest CPU count, then the most recent
    a = dataclasses.replace(_real(), order=1, cpus=2)
    b = dataclasses.replace(_real(), order=2, cpus=16)
    c = dataclasses.replace(_real(), order=3, cpus=2)
    assert rr.planner_times(dataclasses.replace(_real(), order=4, cpus=4), [a, b, c]) is c
    assert rr.planner_times(dataclasses.replace(_real(), order=4, cpus=32), [a, b, c]) is b
