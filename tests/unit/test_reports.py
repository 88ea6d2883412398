"""The pictures (factory/reports/): static pages with inline SVG, parsed strictly with html5lib
(the browser tests in tests/integration/test_reports.py look at them in Chromium)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import html5lib
import pytest

from factory.reports.build_report import (
    AttemptPicture,
    build_report_html,
    read_events,
)
from factory.reports.page import nice_ticks, time_ticks
from factory.units import format_size

NS = "{http://www.w3.org/1999/xhtml}"
SVG = "{http://www.w3.org/2000/svg}"


def parse(text: str) -> Any:
    """Strict: any parse error fails the test."""
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=True).parse(text)


def test_ticks_are_round() -> None:
    assert nice_ticks(10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(67) == [0, 20, 40, 60, 80]
    assert time_ticks(1200)[1] == "min" and time_ticks(120)[1] == "s"


def events_file(tmp_path: Path) -> Path:
    t0 = 1_800_000_000.0
    out = "/factory/src/build/temp.linux-x86_64-cpython-311/csrc/{}.o"
    lines = [{"t": t0, "rss": 0, "anon": 100, "jobs": 0},
             {"t": t0 + 1, "start": out.format("long")}, {"t": t0 + 1, "start": out.format("b")},
             {"t": t0 + 2, "rss": 3 << 30, "anon": 4 << 30, "jobs": 2},
             {"t": t0 + 30, "end": out.format("b"), "peak": 1},
             {"t": t0 + 30, "start": "/factory/src/build/lib/ext.so"},  # the link: not drawn
             {"t": t0 + 31, "start": out.format("c")},
             {"t": t0 + 60, "end": out.format("c"), "peak": 1},
             {"t": t0 + 100, "end": out.format("long"), "peak": 1},
             {"t": t0 + 101, "rss": 0, "anon": 200, "jobs": 0}]
    path = tmp_path / "a.log.events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines) + "{truncated")
    return path


def test_events_become_a_timeline_and_samples(tmp_path: Path) -> None:
    objects, samples = read_events(events_file(tmp_path))
    assert [(o.key, o.start, o.end) for o in objects] == [
        ("csrc/b", 1.0, 30.0), ("csrc/long", 1.0, 100.0), ("csrc/c", 31.0, 60.0)]
    assert [s.t for s in samples] == [0.0, 2.0, 101.0] and samples[1].anon == 4 << 30
    assert read_events(tmp_path / "missing") == ((), ())


def test_a_cached_compile_is_drawn_from_its_first_stage(tmp_path: Path) -> None:
    """Through sccache nvcc's stages run in its server with their -o in a temp dir (named
    after the source once cicc runs); only the last stage has the object's -o."""
    t0 = 1_800_000_000.0
    obj = "/factory/src/build/temp.linux-x86_64-cpython-311/csrc/flash_fwd.o"
    stage = "/tmp/sccache_nvccZfDC3K/{}"
    lines = [{"t": t0, "start": stage.format("x_0.cpp4.ii")},
             {"t": t0 + 1, "end": stage.format("x_0.cpp4.ii")},
             {"t": t0 + 2, "start": stage.format("flash_fwd.ptx")},
             {"t": t0 + 85, "end": stage.format("flash_fwd.ptx")},
             {"t": t0 + 85, "start": stage.format("flash_fwd.cubin")},
             {"t": t0 + 128, "end": stage.format("flash_fwd.cubin")},
             {"t": t0 + 128, "start": obj}, {"t": t0 + 133, "end": obj}]
    path = tmp_path / "a.log.events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    objects, _ = read_events(path, ["csrc/flash_fwd", "csrc/flash_bwd"])
    assert [(o.key, o.start, o.end) for o in objects] == [("csrc/flash_fwd", 0.0, 133.0)]
    # without the build's objects a stage cannot be told apart: the object file alone
    assert [(o.start, o.end) for o in read_events(path)[0]] == [(128.0, 133.0)]


def test_the_build_report_draws_each_attempt(tmp_path: Path) -> None:
    objects, samples = read_events(events_file(tmp_path))
    oom = AttemptPicture(number=1, jobs=4, threads=1, cap_bytes=6 << 30,
                         predicted_peak_bytes=5 << 30, predicted_seconds=90.0,
                         outcome="OOM-killed", objects=objects[:1], samples=samples[:2])
    built = AttemptPicture(number=2, jobs=2, threads=1, cap_bytes=6 << 30,
                           predicted_peak_bytes=4 << 30, predicted_seconds=95.0,
                           outcome="built", objects=objects, samples=samples,
                           predicted={"csrc/long": 90.0, "csrc/b": 25.0})
    text = build_report_html(cell_id="x-1-torch2.14.1-cu130-sm100-cp311", attempts=[oom, built],
                             wheel="x-1+cu130torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl")
    doc = parse(text)
    sections = doc.findall(f".//{NS}section")
    assert [s.get("id") for s in sections] == ["attempt-1", "attempt-2"]
    second = sections[1]
    bars = second.findall(f".//{SVG}rect[@class='object']")
    assert len(bars) == 3
    assert [b.find(f"{SVG}title").text for b in bars] == [
        "csrc/b: 29 s (predicted 25 s)", "csrc/long: 99 s (predicted 90 s)", "csrc/c: 29 s"]
    assert len(second.findall(f".//{SVG}rect[@class='predicted']")) == 2
    assert second.find(f".//{SVG}line[@class='memory-cap']") is not None
    assert second.find(f".//{SVG}line[@class='predicted-peak']") is not None
    assert second.find(f".//{SVG}polyline[@class='rss']") is not None
    facts = [td.text for td in doc.find(f".//{NS}table").findall(f".//{NS}td")]
    assert facts[:3] == ["1", "4 x 1", "6.0 GiB"] and "OOM-killed" in facts


def test_an_attempt_with_nothing_finished_says_so() -> None:
    a = AttemptPicture(number=1, jobs=1, threads=1, cap_bytes=None, predicted_peak_bytes=None,
                       predicted_seconds=None, outcome="failed (exit 1)")
    doc = parse(build_report_html(cell_id="c", attempts=[a]))
    assert "No object finished in this attempt." in "".join(doc.itertext())
    assert doc.find(f".//{SVG}svg") is None


@pytest.mark.parametrize("name", ["<script>", 'a"b'])
def test_names_are_escaped(name: str) -> None:
    a = AttemptPicture(number=1, jobs=1, threads=1, cap_bytes=None, predicted_peak_bytes=None,
                       predicted_seconds=None, outcome=name)
    text = build_report_html(cell_id=name, attempts=[a])
    parse(text)
    assert "<script>" not in text


COVERAGE_MATRIX = """
version = 1
[axes]
torch = ["2.14.1"]
cuda = ["12.6", "13.0"]
archs = [["9.0"]]
python = ["3.11", "3.12"]
[packages.demo-ext]
recipe = "torch-extension"
versions = ["1.0"]
[[exclude]]
cuda = "12.6"
python = "3.12"
[[include]]
package = "demo-ext"
torch = "2.14.1"
cuda = "13.0"
archs = ["10.3"]
python = "3.11"
"""


def test_coverage_says_built_missing_cannot_and_not_in_the_matrix(tmp_path: Path) -> None:
    from factory.matrix.load import load_matrix
    from factory.reports.coverage import coverage, coverage_html

    (tmp_path / "matrix.toml").write_text(COVERAGE_MATRIX)
    matrix = load_matrix(tmp_path / "matrix.toml")
    built = next(pc for pc in matrix.cells if pc.cell.id.endswith("cu130-sm90-cp311"))
    (grid,) = coverage(matrix, published={built.content_key}, readiness=lambda pc: (
        pc.cell.cuda != "12.6", "no CUDA 12.6 image"))
    assert grid.columns == (("12.6", (90,), "x86_64"), ("12.6", (103,), "x86_64"),
                            ("13.0", (90,), "x86_64"), ("13.0", (103,), "x86_64"))
    status = {(col, c.python): (c.status, c.detail) for (_, col), chips in grid.chips.items()
              for c in chips}
    assert status[(2, "3.11")] == ("built", "published")
    assert status[(2, "3.12")] == ("missing", "not built yet")
    assert status[(0, "3.11")] == ("cannot", "no toolchain here: no CUDA 12.6 image")
    assert status[(0, "3.12")][0] == "absent"  # excluded
    assert status[(1, "3.11")][0] == "cannot" and "CUDA >= 12.9" in status[(1, "3.11")][1]
    assert status[(3, "3.11")][0] == "missing" and status[(3, "3.12")][0] == "absent"
    doc = parse(coverage_html([grid], store="s3://b/p", matrix="matrix.toml"))
    chips = doc.findall(f".//{NS}span[@data-cell]")
    assert len(chips) == 8
    assert {c.get("class") for c in chips} == {"chip built", "chip missing", "chip cannot",
                                               "chip absent"}


def test_coverage_of_a_matrix_with_tracking_rules_shows_its_cells_and_skips() -> None:
    """The repo's matrix.toml names rules ('latest:2', 'default', 'torch'): the grid is made
    from the cells they resolve to, and a skipped cell is a 'cannot' square with its reason."""
    from factory.matrix.load import load_matrix
    from factory.reports.coverage import coverage

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.toml")
    grids = coverage(matrix, published=set(), readiness=lambda pc: (True, ""))
    chips = {c.cell_id: c for g in grids for row in g.chips.values() for c in row}
    assert all(chips[pc.cell.id].status == "missing" for pc in matrix.cells)
    for skip in matrix.skipped:
        if skip.cell in chips:
            assert chips[skip.cell].status == "cannot" and chips[skip.cell].detail == skip.reason


def test_the_lanes_page_parses_and_draws_every_slot_and_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``factory schedule --html`` on a few of the repo matrix's cells and one builder whose name
    needs escaping: each slot a row, each cell a rect titled with its id, the makespan line."""
    from factory.cli import main

    builders = tmp_path / "builders.toml"
    builders.write_text('[[builder]]\nname = "small & <quick>"\nmemory = "64g"\ncpus = 16\n'
                        'platform = "x86_64"\n')
    page = tmp_path / "lanes.html"
    assert main(["schedule", "--builders", str(builders), "--html", str(page), "--json",
                 "--matrix", str(Path(__file__).resolve().parents[2] / "matrix.toml"),
                 "--package", "causal-conv1d", "--package", "factory-example-ext"]) == 0
    doc = json.loads(capsys.readouterr().out)
    slots = [s for b in doc["builders"] for s in b["slots"] if s["cells"]]
    want = [c for s in slots for c in s["cells"]]
    assert len(want) == 3
    html = parse(page.read_text())
    rects = html.findall(f".//{SVG}g[@class='cell']/{SVG}rect")
    assert [r.find(f"{SVG}title").text.split(":")[0] for r in rects] == want
    labels = [t.text for t in html.iter(f"{SVG}text") if t.text and " slot " in t.text]
    assert labels == [f"small & <quick> slot {s['slot']} ({format_size(s['memory_bytes'])}, "
                      "16 CPUs)" for s in slots]
    assert html.find(f".//{SVG}line[@class='makespan_seconds']") is not None
    sub = html.find(f".//{NS}p[@class='sub']")
    assert "".join(sub.itertext()).startswith("3 cell(s); predicted makespan")
