"""The whole build path through the CLI, in a real docker container under a real memory cap:
a hand-picked MAX_JOBS is OOM-killed where the planner's plan builds first time, and an OOM
kill in the middle of a build resumes without recompiling the objects already finished.

One build tree and venv serve the three builds (as an OOM retry would reuse them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import html5lib
import pytest
from conftest import EXAMPLE_CELL, REPO, cache_root, write_example_matrix

from factory.matrix.cell import Cell

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _matrix(tmp: Path) -> Path:
    return write_example_matrix(tmp / "matrix.toml", work_dir=cache_root() / "work-pipeline-test",
                                store=tmp / "store")


def _factory(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "factory", *args], capture_output=True, text=True,
        env={**os.environ, "CI": "true", **(env or {})}, cwd=REPO, timeout=1500,
    )


def _manifest(out: Path) -> dict[str, Any]:
    (path,) = out.glob("*.provenance.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def pipeline(tmp_path: Path, base_image: str, wheelhouse_cp311: Path, cuda13_home: Path,
             monkeypatch: pytest.MonkeyPatch) -> Path:
    # a fresh history: the planner starts from the shipped measurements only
    monkeypatch.setenv("FACTORY_MEMORY_HISTORY", str(tmp_path / "history.json"))
    work = cache_root() / "work-pipeline-test" / EXAMPLE_CELL
    shutil.rmtree(work / "src", ignore_errors=True)
    return _matrix(tmp_path)


def test_planner_builds_where_a_fixed_max_jobs_is_oom_killed_and_an_oom_resumes(
    pipeline: Path, tmp_path: Path
) -> None:
    matrix = str(pipeline)
    # 1. Everything at once (MAX_JOBS=5, one job per object) under 3 GiB: OOM-killed, and said
    #    so. (At 4 GiB the five jobs sat right at the limit and cgroup v1 thrashed instead of
    #    killing: a cap needs the planner's headroom, not a best guess.)
    naive = _factory("build", EXAMPLE_CELL, "--matrix", matrix, "--memory", "3g",
                     "--max-jobs", "5", "--attempts", "1", "--no-import-check",
                     "--out", str(tmp_path / "naive"))
    assert naive.returncode == 8, naive.stderr[-3000:]
    assert "OOM-killed" in naive.stderr
    assert "no attempt left (--attempts 1)" in naive.stderr and "resuming" not in naive.stderr
    assert not list((tmp_path / "naive").glob("*.whl"))

    # 2. The planner refuses that cap, naming what one job needs, and under 4 GiB builds
    #    right first time with no OOM.
    refused = _factory("plan", EXAMPLE_CELL, "--matrix", matrix, "--memory", "3g")
    assert refused.returncode == 6 and "needs at least" in refused.stderr
    plan = json.loads(_factory("plan", EXAMPLE_CELL, "--matrix", matrix, "--memory", "4g",
                               "--json").stdout)
    assert plan["max_jobs"] < 5
    planned = _factory("build", EXAMPLE_CELL, "--matrix", matrix, "--memory", "4g",
                       "--no-import-check", "--out", str(tmp_path / "planned"))
    assert planned.returncode == 0, planned.stderr[-3000:]
    attempts = _manifest(tmp_path / "planned")["attempts"]
    assert len(attempts) == 1 and not attempts[0]["oom_killed"]
    assert attempts[0]["max_jobs"] == plan["max_jobs"]
    # Progress from the sampler: every object's start and end, named by its -o; and every line
    # of the cell's build names the cell (CI is set: no terminal).
    events = [json.loads(line) for line in
              Path(attempts[0]["log"] + ".events.jsonl").read_text().splitlines()]
    started = {e["start"] for e in events if str(e.get("start", "")).endswith(".o")}
    ended = {e["end"] for e in events if str(e.get("end", "")).endswith(".o")}
    assert len(started) == 5 and started == ended  # four kernels and the bindings
    assert any("rss" in e for e in events)
    short = Cell.from_id(EXAMPLE_CELL).short_id
    lines = planned.stderr.splitlines()
    cell_lines = lines[:next(i for i, ln in enumerate(lines) if ln.endswith("] summary"))]
    assert cell_lines and all(ln.startswith(f"[{short}] ") for ln in cell_lines if ln.strip())
    assert any(" compiling, " in ln and "/5 objects" in ln for ln in cell_lines)
    # ... and the build report beside the logs draws those objects and the memory samples
    work = cache_root() / "work-pipeline-test" / EXAMPLE_CELL
    (report,) = [p for p in (work / "logs").glob("*-report.html")
                 if p.name.split("-report")[0] in attempts[0]["log"]]
    page = html5lib.parse(report.read_text(), namespaceHTMLElements=False)
    svg = "{http://www.w3.org/2000/svg}"
    assert len(page.findall(f".//{svg}rect[@class='object']")) == 5
    assert page.find(f".//{svg}polyline[@class='rss']") is not None
    assert page.find(f".//{svg}line[@class='memory-cap']") is not None
    # the build as a whole run in the history, with the CPU seconds its compilers' cgroup used
    # (a run starved of CPUs supplies no times: object_times.MIN_ON_CPU)
    history = json.loads((tmp_path / "history.json").read_text())
    (entry,) = [e for e in history["objects"] if e["package"] == "factory-example-ext"]
    (run,) = entry["runs"]
    assert run["max_jobs"] == plan["max_jobs"] and run["cpu_seconds"] > 0

    # 3. A real OOM kill after two objects (fault injection inside the container), from a
    #    clean tree: the retry runs with fewer jobs and compiles only what was left.
    for build_dir in (work / "src").glob("build"):
        shutil.rmtree(build_dir)
    resumed = _factory("build", EXAMPLE_CELL, "--matrix", matrix, "--memory", "6g",
                       "--no-import-check", "--out", str(tmp_path / "resumed"),
                       env={"FACTORY_FAULT_OOM_AFTER": "2"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, second = _manifest(tmp_path / "resumed")["attempts"]
    assert (f"was OOM-killed after {first['objects_built']} object(s); resuming with fewer jobs"
            in resumed.stderr)
    assert first["oom_killed"] and first["max_jobs"] >= 2
    assert second["max_jobs"] < first["max_jobs"] and not second["oom_killed"]
    # the retry's progress counts the first attempt's objects as done, and the report draws
    # both attempts
    lines = resumed.stderr.splitlines()
    retry = lines[next(i for i, ln in enumerate(lines) if "attempt 2: MAX_JOBS" in ln):]
    progress = next(ln for ln in retry if "/5 objects" in ln)
    done = int(progress.split("/5 objects")[0].rsplit(" ", 1)[-1])
    # what the first attempt left in .ninja_log is what the retry does not compile; ninja's
    # status count (objects_built) can be one higher: it prints an edge's end before it logs it,
    # and the kill may fall between the two
    total_objects = 5  # four kernels and the bindings
    assert second["objects_total"] is not None
    kept = total_objects - second["objects_total"]
    assert done >= kept >= 2 and first["objects_built"] >= kept, progress
    stamp = Path(second["log"]).name.split("-attempt")[0]
    both = html5lib.parse((work / "logs" / f"{stamp}-report.html").read_text(),
                          namespaceHTMLElements=False)
    sections = [s.get("id") for s in both.iter("section")]
    assert sections == ["attempt-1", "attempt-2"]
    assert "OOM-killed" in "".join(both.find(".//table").itertext())
    assert second["objects_total"] < total_objects
    # ninja logs every finished object once per compile: none was compiled twice
    (ninja_log,) = (work / "src" / "build").glob("temp*/.ninja_log")
    outputs = [ln.split("\t")[3] for ln in ninja_log.read_text().splitlines()
               if ln and not ln.startswith("#")]
    assert len(outputs) == len(set(outputs)) == total_objects
