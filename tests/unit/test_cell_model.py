"""One cell model for `factory plan` and `factory schedule` (factory.planning.cell_model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.cli import main
from factory.matrix.load import load_matrix
from factory.planning.builders import Builder
from factory.planning.cell_model import CELL_OVERHEAD_SECONDS, cell_time, overhead_of
from factory.planning.cell_times import CellTimes, shared_span
from factory.planning.history_file import shipped_history_path
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import plan_for
from factory.planning.schedule import schedule
from factory.units import GIB

MATRIX = """
[axes]
torch = ["2.11.0"]
cuda = ["13.0"]
archs = [["9.0"]]
python = ["3.12"]

[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]
"""


def shipped() -> MemoryHistory:
    return MemoryHistory.load(shipped_history_path())


@pytest.mark.parametrize(("memory", "cpus"), [(64, 16), (160, 32), (32, 8)])
def test_a_cell_alone_takes_the_planners_span_in_the_schedule(memory: int, cpus: int) -> None:
    pc = load_matrix(text=MATRIX).cells[0]
    h = shipped()
    plan = plan_for(pc.cell, supports_threads=True, memory_model_key="flash-attn",
                    memory=memory * GIB, cpus=cpus, history=h)
    times = CellTimes(h)
    compile_phase = times.compile(pc, memory * GIB, cpus)
    assert compile_phase is not None and plan.predicted_seconds is not None
    assert shared_span(cpus, [[compile_phase]])[0] == pytest.approx(plan.predicted_seconds)
    t = cell_time(pc.cell, plan, h, model_key="flash-attn")
    one = schedule([pc], (Builder(name="b", memory_bytes=memory * GIB, cpus=cpus,
                                  platform="x86_64"),), history=h)
    assert one.makespan_seconds == pytest.approx(t.seconds)


def test_the_overhead_is_the_median_of_the_measured_runs() -> None:
    doc = shipped().as_document()
    doc["defaults"]["flash-attn"]["cell_overhead"] = [
        {"seconds": 50.0, "source": "a"}, {"seconds": 70.0, "source": "b"},
        {"seconds": 64.0, "source": "c"}]
    seconds, source = overhead_of(MemoryHistory(doc, path=None), "flash-attn")
    assert seconds == 64.0 and "3 measured run(s)" in source
    del doc["defaults"]["flash-attn"]["cell_overhead"]
    assert overhead_of(MemoryHistory(doc, path=None), "flash-attn")[0] == CELL_OVERHEAD_SECONDS


def test_plan_json_has_the_whole_cell(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text("version = 1\n" + MATRIX)
    assert main(["plan", "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312", "--matrix",
                 str(matrix), "--memory", "64g", "--cpus", "16", "--history",
                 str(tmp_path / "h.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted_cell_seconds"] == pytest.approx(
        out["predicted_seconds"] + out["cell_overhead_seconds"], abs=0.2)


def test_schedule_reads_the_history_plan_reads(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The matrix's memory-history setting, as `factory plan` and `factory build` read it: a
    # builder whose own runs were twice as slow predicts twice the compile.
    monkeypatch.delenv("FACTORY_MEMORY_HISTORY", raising=False)
    doc = shipped().as_document()
    slow = [dict(e) for e in doc["objects"] if e["package"] == "flash-attn"]
    for e in slow:
        e["seconds"] = {k: 2 * v for k, v in e["seconds"].items()}
    (tmp_path / "h.json").write_text(json.dumps({"version": 1, "objects": slow}))
    (tmp_path / "builders.toml").write_text(
        '[[builder]]\nname = "b"\nmemory = "64g"\ncpus = 16\n')
    spans = []
    for settings in ("", '[settings]\nmemory-history = "h.json"\n'):
        (tmp_path / "matrix.toml").write_text(f"version = 1\n{settings}{MATRIX}")
        assert main(["schedule", "--matrix", str(tmp_path / "matrix.toml"), "--builders",
                     str(tmp_path / "builders.toml"), "--json"]) == 0
        spans.append(json.loads(capsys.readouterr().out)["makespan_seconds"])
        assert main(["plan", "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312", "--matrix",
                     str(tmp_path / "matrix.toml"), "--memory", "64g", "--cpus", "16",
                     "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert spans[-1] == pytest.approx(plan["predicted_cell_seconds"], abs=0.2)
    assert spans[1] > 1.8 * spans[0] - 120
