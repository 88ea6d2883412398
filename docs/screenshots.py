"""Make the README's pictures with the factory's own pages in headless Chromium.

    python docs/screenshots.py          # writes docs/images/build-report.png, coverage.png

- The build report of the flash-attn sm_90 build on the 2x H200 machine of 2026-12-01
  (benchmarks/gpu/results-2026-12-01-h200x2/): its plan and the per-object times the plan
  replayed (the shipped history), its ninja log (the objects' times) and the host's used
  memory over the build (that run predates the sampler's events file, so
  the curve is the host's used memory minus what it used idle, not the compilers' RSS).
- The coverage page of a demo matrix (DEMO below: three torch minors, two CUDA versions, three
  arch sets, three Pythons) against a store in which some of its cells are published (and,
  as on a builder without the CUDA 12.8 image, the 12.8 cells cannot be built here).
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

from factory.matrix.cell import Cell  # noqa: E402
from factory.matrix.load import load_matrix  # noqa: E402
from factory.planning.eta import model_for  # noqa: E402
from factory.planning.memory_model import MemoryHistory  # noqa: E402
from factory.planning.ninja_log import read_ninja_timeline  # noqa: E402
from factory.reports.build_report import AttemptPicture, Sample, build_report_html  # noqa: E402
from factory.reports.coverage import coverage, coverage_html  # noqa: E402

RUN = ROOT / "benchmarks/gpu/results-2026-12-01-h200x2"
CELL = "flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312"
DEMO = """
version = 1
[settings]
store = "store"
[axes]
torch = ["2.12.0", "2.13.0", "2.14.1"]
cuda = ["12.8", "13.0"]
archs = [["9.0"], ["10.0"], ["12.0"]]
python = ["3.11", "3.12", "3.13"]
[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]
[[exclude]]
torch = "2.12.0"
python = "3.13"
"""


def h200_attempt() -> AttemptPicture:
    """The 2026-12-01 H200 build as the report draws it (see the module docstring)."""
    plan = json.loads((RUN / "plan.json").read_text())
    log = RUN / f"{CELL}.ninja_log"
    timeline = read_ninja_timeline(log)
    # Align ninja's clock (seconds from its start) with the memory log's (epoch seconds, from
    # the stage's start): the factory's step line says when attempt 1 began, and its first
    # progress line when it saw the first object end (which ninja logs at its own time).
    steps = (RUN / "planned.log").read_text()
    attempt = float(re.search(r"\[\s*([\d.]+)s\] attempt 1:", steps).group(1))  # type: ignore[union-attr]
    seen = float(re.search(r"objects, (\d+)s, ETA", steps).group(1))  # type: ignore[union-attr]
    first_end = min(o.end for o in timeline)
    stage = int((RUN / "planned.mem_used_mb.log").read_text().split()[0])
    t0 = stage + attempt + (seen - first_end)
    rows = [line.split() for line in (RUN / "planned.mem_used_mb.log").read_text().splitlines()]
    idle = min(int(mb) for _, mb in rows)
    samples = tuple(Sample(float(t) - t0, (int(mb) - idle) << 20, None) for t, mb in rows
                    if float(t) >= t0 - 5)
    ending = max(o.end for o in timeline)
    samples = tuple(s for s in samples if s.t <= ending + 30)
    cell = Cell.from_id(CELL)
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
    return build_report_html(cell_id=CELL, attempts=[h200_attempt()],
                             wheel="flash_attn-2.8.3.post2+cu130torch2.11sm90-cp312-cp312-"
                             "manylinux_2_28_x86_64.whl",
                             note="2x H200 host, 32 CPUs, 160 GiB cap (2026-12-01)")


def demo_coverage(tmp: Path) -> str:
    (tmp / "matrix.toml").write_text(DEMO)
    matrix = load_matrix(tmp / "matrix.toml")
    built = {pc.content_key for pc in matrix.cells
             if pc.cell.torch != "2.12.0" and pc.cell.python != "3.13" and pc.cell.cuda == "13.0"}
    grids = coverage(matrix, published=built, readiness=lambda pc: (
        pc.cell.cuda != "12.8", "CUDA 12.8 comes in the image factory-cuda:12.8-py3.X"))
    return coverage_html(grids, store="s3://wheels/prod", matrix="matrix.toml (demo)")


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
    screenshot(h200_report(), out / "build-report.png")
    with tempfile.TemporaryDirectory() as tmp:
        screenshot(demo_coverage(Path(tmp)), out / "coverage.png")
    for png in sorted(out.glob("*.png")):
        print(f"{png.relative_to(ROOT)}: {png.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
