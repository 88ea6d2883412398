"""Make the README's pictures with the factory's own pages in headless Chromium.

    python docs/screenshots.py          # writes docs/images/build-report.png, coverage.png

- The build report exactly as a build wrote it: the torch-scatter sm_100 cell built on the
  2-core builder with the docker runner on 2026-12-02 (benchmarks/results-2026-12-02-catalog/:
  the page, the sampler's events it was drawn from, the provenance): every object on a
  timeline with the plan's seconds as outlines, the compilers' memory against the predicted
  peak and the cap.
- ``h200_report()``: the report drawn by the same code from the flash-attn sm_90 build on the
  2x H200 machine of 2026-12-01 (benchmarks/gpu/results-2026-12-01-h200x2/: its plan, ninja log
  and the host's used memory; that run predates the sampler), 73 objects longest first: the
  browser test of the report (tests/integration/test_reports.py) draws it.
- The coverage page the real `factory matrix --html` code draws for the repository's own
  matrix (its catalog packages), with the cells built on that builder that day (their content
  keys from the provenance files beside the report) as published, and this machine's
  readiness for the rest (so the cannot-build chips say what this machine lacks).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from factory.build.readiness import ReadinessChecker  # noqa: E402
from factory.matrix.cell import Cell  # noqa: E402
from factory.matrix.load import PlannedCell, load_matrix  # noqa: E402
from factory.planning.eta import model_for  # noqa: E402
from factory.planning.memory_model import MemoryHistory  # noqa: E402
from factory.planning.ninja_log import read_ninja_timeline  # noqa: E402
from factory.reports.build_report import AttemptPicture, Sample, build_report_html  # noqa: E402
from factory.reports.coverage import coverage, coverage_html  # noqa: E402

RUN = ROOT / "benchmarks/results-2026-12-02-catalog"
H200_RUN = ROOT / "benchmarks/gpu/results-2026-12-01-h200x2"
H200_CELL = "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312"
REPORT = RUN / "torch-scatter-2.1.2-torch2.14.1-cu130-sm100-cp311.report.html"
PACKAGES = ("causal-conv1d", "grouped-gemm", "mamba-ssm", "torch-scatter")


def h200_attempt() -> AttemptPicture:
    """The 2026-12-01 H200 build as the report draws it (see the module docstring)."""
    plan = json.loads((H200_RUN / "plan.json").read_text())
    log = H200_RUN / f"{H200_CELL}.ninja_log"
    timeline = read_ninja_timeline(log)
    # Align ninja's clock (seconds from its start) with the memory log's (epoch seconds, from
    # the stage's start): the factory's step line says when attempt 1 began, and its first
    # progress line when it saw the first object end (which ninja logs at its own time).
    steps = (H200_RUN / "planned.log").read_text()
    attempt = float(re.search(r"\[\s*([\d.]+)s\] attempt 1:", steps).group(1))  # type: ignore[union-attr]
    seen = float(re.search(r"objects, (\d+)s, ETA", steps).group(1))  # type: ignore[union-attr]
    first_end = min(o.end for o in timeline)
    memory_log = (H200_RUN / "planned.mem_used_mb.log").read_text()
    stage = int(memory_log.split()[0])
    t0 = stage + attempt + (seen - first_end)
    rows = [line.split() for line in memory_log.splitlines()]
    idle = min(int(mb) for _, mb in rows)
    samples = tuple(Sample(float(t) - t0, (int(mb) - idle) << 20, None) for t, mb in rows
                    if float(t) >= t0 - 5)
    ending = max(o.end for o in timeline)
    samples = tuple(s for s in samples if s.t <= ending + 30)
    cell = Cell.from_id(H200_CELL)
    model = model_for(MemoryHistory.load().object_times(cell), archs=1, jobs=plan["max_jobs"],
                      threads=plan["nvcc_threads"], cpus=plan["cpus"])
    return AttemptPicture(
        predicted=model.predicted if model else {},
        number=1, jobs=plan["max_jobs"], threads=plan["nvcc_threads"],
        cap_bytes=plan["memory_budget_bytes"], predicted_peak_bytes=plan["predicted_peak_bytes"],
        predicted_seconds=plan["predicted_seconds"], outcome="built",
        objects=tuple(timeline), samples=samples,
        memory_label="host memory used - idle (free, every 2 s)")


def h200_report() -> str:
    return build_report_html(cell_id=H200_CELL, attempts=[h200_attempt()],
                             wheel="flash_attn-2.8.3.post2+cu130torch2.11sm90-cp312-cp312-"
                             "manylinux_2_28_x86_64.whl",
                             note="2x H200 host, 32 CPUs, 160 GiB cap (2026-12-01)")


def catalog_coverage() -> str:
    matrix = load_matrix(ROOT / "matrix.toml")
    built = {json.loads(p.read_text())["content_key"] for p in RUN.glob("*.provenance.json")}
    checker = ReadinessChecker(matrix.settings)

    def readiness(pc: PlannedCell) -> tuple[bool, str]:
        r = checker.check(pc)
        return r.buildable, r.line()

    grids = [g for g in coverage(matrix, published=built, readiness=readiness)
             if g.package in PACKAGES]
    return coverage_html(grids, store="the 2-core builder's store, 2026-12-02",
                         matrix="matrix.toml")


def screenshot(html: str, out: Path, *, width: int = 1100) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                f"--window-size={width},900"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"),
                               options=options)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "page.html"
            page.write_text(html)
            browser.get(page.as_uri())
            height = int(browser.execute_script(
                "return Math.ceil(document.body.getBoundingClientRect().bottom) + 24"))
            browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            browser.save_screenshot(str(out))
    finally:
        browser.quit()


def main() -> int:
    out = ROOT / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    screenshot(REPORT.read_text(), out / "build-report.png")
    screenshot(catalog_coverage(), out / "coverage.png")
    for png in sorted(out.glob("*.png")):
        print(f"{png.relative_to(ROOT)}: {png.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
