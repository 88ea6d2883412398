"""The pictures in a real headless Chromium: the build report (objects over time, memory against
the prediction and the cap), the coverage page written into a store and served by the factory's
own server next to the finder, and the schedule's lanes. Static pages: no server needed except
where the page lives in the index tree."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.index.server import RunningServer, running_server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "docs"))
import screenshots  # noqa: E402  (the README's pictures are made from the same pages)


def _factory(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "factory", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def _fits_1100(browser: Any) -> bool:
    return bool(browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth"))


def test_the_build_report_draws_the_objects_and_the_memory(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    page = tmp_path / "report.html"
    page.write_text(screenshots.h200_report())
    browser.set_window_size(1100, 900)
    browser.get(page.as_uri())
    bars = browser.find_elements(By.CSS_SELECTOR, ".timeline rect.object")
    assert len(bars) == 73 and all(b.is_displayed() for b in bars[:5])
    # the longest objects started first (the factory's order), so the first row's bar is long
    widths = [b.rect["width"] for b in bars]
    assert widths[0] > 0.6 * max(widths) and widths[-1] < 0.2 * max(widths)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".timeline rect.predicted")) == 73
    curve = browser.find_element(By.CSS_SELECTOR, ".memory polyline.rss")
    assert curve.rect["width"] > 500
    cap = browser.find_element(By.CSS_SELECTOR, ".memory line.memory-cap").rect["y"]
    predicted = browser.find_element(By.CSS_SELECTOR, ".memory line.predicted-peak").rect["y"]
    assert cap < predicted  # 160 GiB sits above 114.7 GiB
    assert _fits_1100(browser)
    first = bars[0].find_element(By.TAG_NAME, "title").get_attribute("textContent")
    assert first.startswith("csrc/flash_attn/src/flash_fwd_split_") and "predicted" in first


@pytest.fixture
def served_coverage(tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    """A store that has one of the default matrix's cells (its provenance names the content
    key), the coverage page written into it by 'factory matrix --html', served."""
    matrix = json.loads(_factory("matrix", "--json", "--matrix", str(REPO / "matrix.toml"),
                                 cwd=REPO).stdout)
    cell = next(c for c in matrix["cells"] if c["package"] == "factory-example-ext")
    store = tmp_path / "store"
    files = store / "files" / "factory-example-ext"
    files.mkdir(parents=True)
    (files / cell["wheel"]).write_bytes(b"not a real wheel: only its provenance is read")
    (files / (cell["wheel"] + ".provenance.json")).write_text(
        json.dumps({"content_key": cell["content_key"]}))
    done = _factory("matrix", "--html", "--matrix", str(REPO / "matrix.toml"), "--store",
                    str(store), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (store / "coverage" / "index.html").is_file()
    with running_server(store) as server:
        yield server, store


def test_the_coverage_page_is_served_in_the_index_tree(browser: Any,
                                                       served_coverage: tuple[Any, Path]) -> None:
    from selenium.webdriver.common.by import By

    server, _ = served_coverage
    browser.set_window_size(1100, 900)
    browser.get(server.url + "coverage")  # the server redirects to coverage/
    assert browser.current_url == server.url + "coverage/"
    built = browser.find_elements(By.CSS_SELECTOR, ".chip.built")
    assert [c.get_attribute("data-cell") for c in built] == [
        "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"]
    missing = browser.find_elements(By.CSS_SELECTOR, ".chip.missing")
    # every other package of the matrix (flash-attn, the catalog's) is missing; the example's
    # one cell is built
    assert missing and not any("factory-example-ext" in (c.get_attribute("data-cell") or "")
                               for c in missing)
    assert browser.find_element(By.CSS_SELECTOR, ".total-built b").text == "1"
    tip = missing[0].get_attribute("title") or ""
    assert "missing (not built yet)" in tip
    assert _fits_1100(browser)
    link = browser.find_element(By.LINK_TEXT, "find a wheel").get_attribute("href")
    assert link == server.url + "finder/"


def test_an_index_rebuild_keeps_the_coverage_page(tmp_path: Path) -> None:
    from index_wheels import make_wheel

    from factory.index.publish import publish
    from factory.store import LocalStore

    store = LocalStore(tmp_path / "store")
    publish(store, [make_wheel(tmp_path, "other-pkg", "3.0")])
    done = _factory("matrix", "--html", "--matrix", str(REPO / "matrix.toml"), "--store",
                    str(store.root), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = store.root / "coverage" / "index.html"
    before = page.read_bytes()
    done = _factory("index", "rebuild", "--store", str(store.root), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert page.read_bytes() == before
    assert _factory("index", "verify", "--store", str(store.root), cwd=tmp_path).returncode == 0


def test_the_lanes_page_shows_each_slot_and_its_cells(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    page = tmp_path / "lanes.html"
    done = _factory("schedule", "--builders", str(REPO / ".github/builders.toml"), "--matrix",
                    str(REPO / "matrix.toml"), "--html", str(page), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    browser.get(page.as_uri())
    cells = browser.find_elements(By.CSS_SELECTOR, ".lanes g.cell rect")
    want = [c for b in doc["builders"] for s in b["slots"] for c in s["cells"]]
    titles = [c.find_element(By.TAG_NAME, "title").get_attribute("textContent") for c in cells]
    assert [t.split(":")[0] for t in titles] == want
    assert all(c.rect["width"] > 10 for c in cells)
    makespan = browser.find_element(By.CSS_SELECTOR, ".lanes line.makespan_seconds")
    ends = max(c.rect["x"] + c.rect["width"] for c in cells)
    assert abs(makespan.rect["x"] - ends) < 3  # the longest slot ends at the makespan
