"""The finder page: valid HTML (html5lib's strict parser), and in a real headless Chromium it
loads, fills in the install lines for the host it is served from, and filters by typing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from index_wheels import make_wheel, variant_wheel

from factory.index.pages import FINDER_KEY
from factory.index.publish import publish, yank
from factory.index.server import RunningServer, running_server
from factory.index.store import LocalStore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalStore:
    tmp = tmp_path_factory.mktemp("finder")
    store = LocalStore(tmp / "store")
    wheels = [
        variant_wheel(
            tmp,
            "fa-demo",
            "1.0",
            torch,
            cuda=cuda,
            archs=archs,
            tag=f"cp311-cp311-manylinux_2_28_{machine}",
        )
        for torch, cuda, archs, machine in [
            ("2.14", "13.0", "90", "x86_64"),
            ("2.14", "13.0", "100", "x86_64"),
            ("2.11", "12.8", "100", "x86_64"),
            ("2.14", "13.0", "100", "aarch64"),
        ]
    ]
    wheels.append(make_wheel(tmp, "other-pkg", "3.0"))
    wheels.append(make_wheel(tmp, "gone", "1.0"))
    publish(store, wheels)
    yank(store, "gone-1.0-py3-none-any.whl", "broken")
    return store


def test_the_page_is_valid_html_with_a_row_per_live_wheel(store: LocalStore) -> None:
    import html5lib

    data = store.read(FINDER_KEY)
    assert data is not None
    tree = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(data)  # raises
    rows = tree.findall(".//tbody/tr")
    assert len(rows) == 5  # the yanked wheel is not offered
    sm100_arm = next(r for r in rows if "aarch64" in r.get("title"))
    cells = [td.text for td in sm100_arm.findall("td")][:10]
    assert cells[:9] == [
        "fa-demo",
        "1.0+cu130torch2.14sm100",
        "2.14",
        "13.0",
        "sm_100",
        "cp311",
        "aarch64",
        "2.28",
        cells[8],
    ]
    code = sm100_arm.find(".//code")
    assert code.get("data-path") == "cu130-torch2.14-sm100/simple/"  # one URL for both CPUs
    assert code.get("data-requirement") == "fa-demo==1.0+cu130torch2.14sm100"


@pytest.fixture(scope="module")
def served(store: LocalStore) -> Iterator[RunningServer]:
    with running_server(store.root) as server:
        yield server


def _visible(browser: object) -> list[str]:
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, "#wheels tbody tr")  # type: ignore[attr-defined]
    return [r.get_attribute("title") for r in rows if r.is_displayed()]


def test_chromium_loads_the_page_and_filters_by_typing(
    browser: object, served: RunningServer
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(served.url + "finder/")  # type: ignore[attr-defined]
    assert len(_visible(browser)) == 5
    count = browser.find_element(By.ID, "count")  # type: ignore[attr-defined]
    assert count.text == "5 of 5 wheels"
    # The install lines name the index the page was loaded from.
    code = browser.find_element(By.CSS_SELECTOR, "tr[title*='sm90'] code")  # type: ignore[attr-defined]
    assert code.text == (
        f"pip install --extra-index-url {served.url}cu130-torch2.14-sm90/simple/ "
        '"fa-demo==1.0+cu130torch2.14sm90"'
    )
    box = browser.find_element(By.ID, "filter")  # type: ignore[attr-defined]
    box.send_keys("sm_100 2.14")
    assert sorted(_visible(browser)) == [
        "fa_demo-1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_aarch64.whl",
        "fa_demo-1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_x86_64.whl",
    ]
    box.send_keys(" x86_64")
    assert _visible(browser) == [
        "fa_demo-1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_x86_64.whl"
    ]
    assert count.text == "1 of 5 wheels"
    box.clear()
    box.send_keys("no-such-thing")
    assert _visible(browser) == [] and count.text == "0 of 5 wheels"


def test_the_page_works_from_a_static_copy(
    browser: object, store: LocalStore, tmp_path: Path
) -> None:
    """file:// stands in for S3/CDN: no server logic, the page still fills in and filters."""
    from selenium.webdriver.common.by import By

    copy = tmp_path / "copy"
    shutil.copytree(store.root, copy)
    browser.get((copy / FINDER_KEY).as_uri())  # type: ignore[attr-defined]
    code = browser.find_element(By.CSS_SELECTOR, "tr[title*='cu128'] code")  # type: ignore[attr-defined]
    assert code.text.startswith(
        f"pip install --extra-index-url {copy.as_uri()}/cu128-torch2.11-sm100/simple/"
    )
    browser.find_element(By.ID, "filter").send_keys("other")  # type: ignore[attr-defined]
    assert _visible(browser) == ["other_pkg-3.0-py3-none-any.whl"]
