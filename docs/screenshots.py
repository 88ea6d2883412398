"""Make the README's pictures with the factory's own pages in headless Chromium.

    python docs/screenshots.py          # writes docs/images/build-report.png, coverage.png

- The build report exactly as a build wrote it: the torch-scatter sm_100 cell built on the
  2-core builder with the docker runner on 2026-12-02 (benchmarks/results-2026-12-02-catalog/:
  the page, the sampler's events it was drawn from, the provenance): every object on a
  timeline with the plan's seconds as outlines, the compilers' memory against the predicted
  peak and the cap.
- The coverage page the real `factory matrix --html` code draws for the repository's own
  matrix (its catalog packages), with the cells built on that builder that day (their content
  keys from the provenance files beside the report) as published, and this machine's
  readiness for the rest (so the cannot-build chips say what this machine lacks).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from factory.build.readiness import ReadinessChecker  # noqa: E402
from factory.matrix.load import PlannedCell, load_matrix  # noqa: E402
from factory.reports.coverage import coverage, coverage_html  # noqa: E402

RUN = ROOT / "benchmarks/results-2026-12-02-catalog"
REPORT = RUN / "torch-scatter-2.1.2-torch2.14.1-cu130-sm100-cp311.report.html"
PACKAGES = ("causal-conv1d", "grouped-gemm", "mamba-ssm", "torch-scatter")


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
