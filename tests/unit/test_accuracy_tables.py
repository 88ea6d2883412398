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
