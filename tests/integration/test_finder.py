"""The finder page: valid HTML (html5lib's strict parser), and in a real headless Chromium: it
loads, fills in the install lines (the doctor's text, for pip, uv, Poetry and PDM) for the host
it is served from, filters by typing (GPU product names too), keeps the view in its URL, sorts
by any column, copies a line, links to each wheel, its project page and variant index, and
holds its layout at 1100 px and on a phone."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from index_wheels import make_wheel, variant_wheel

from factory.index.pages import FINDER_KEY
from factory.index.publish import publish, yank
from factory.index.server import RunningServer, running_server
from factory.store import LocalStore

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
    wheels = tree.findall(".//tbody[@class='wheel']")
    assert len(wheels) == 5  # the yanked wheel is not offered
    sm100_arm = next(w for w in wheels if "aarch64" in w.get("title"))
    cells = ["".join(td.itertext()) for td in sm100_arm.findall("tr/td")][:10]
    assert cells[:8] == ["fa-demo", "1.0+cu130torch2.14sm100", "2.14", "13.0", "sm_100", "cp311",
                         "aarch64", "2.28"]
    assert cells[8].endswith(("KiB", "MiB", " B"))  # binary units, as everywhere
    variant = sm100_arm.find(".//a[@class='variant-link']")
    assert variant.get("href") == "../cu130-torch2.14-sm100/simple/"  # one URL for both CPUs
    assert sm100_arm.get("data-archs") == "100"


@pytest.fixture(scope="module")
def served(store: LocalStore) -> Iterator[RunningServer]:
    with running_server(store.root) as server:
        yield server


def _visible(browser: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, "#wheels tbody.wheel")
    return [r.get_attribute("title") for r in rows if r.is_displayed()]


def _open(browser: Any, url: str, width: int = 1100) -> None:
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    browser.set_window_size(width, 900)
    browser.get(url)


def _line(browser: Any, title: str) -> str:
    from selenium.webdriver.common.by import By

    row = browser.find_element(By.CSS_SELECTOR, f"tbody[title='{title}']")
    return str(row.find_element(By.CSS_SELECTOR, "pre.install-text")
               .get_attribute("textContent"))


SM90 = "fa_demo-1.0+cu130torch2.14sm90-cp311-cp311-manylinux_2_28_x86_64.whl"
SM100 = "fa_demo-1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_x86_64.whl"
SM100_ARM = "fa_demo-1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_aarch64.whl"
CU128 = "fa_demo-1.0+cu128torch2.11sm100-cp311-cp311-manylinux_2_28_x86_64.whl"
OTHER = "other_pkg-3.0-py3-none-any.whl"


def _doctor_text(fmt: str, url: str, project: str, requirement: str) -> str:
    """What 'factory doctor' prints for this wheel: its own formatter."""
    from factory.hosts.choose import Choice
    from factory.hosts.index_reader import IndexAccess
    from factory.hosts.snippets import pip_command, render_snippet
    from factory.index.finder import _page_host

    choice = Choice(project=project, wheel="w.whl", variant=None, why=None,
                    index_url=url, requirement=requirement)
    access = IndexAccess(url="/".join(url.split("/")[:3]) + "/")
    if fmt == "pip":
        return "\n".join(pip_command([choice], access, "python3"))
    return render_snippet(fmt, [choice], access, _page_host()).rstrip("\n")


def test_chromium_loads_the_page_and_filters_by_typing(browser: Any,
                                                       served: RunningServer) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, served.url + "finder/")
    assert len(_visible(browser)) == 5
    count = browser.find_element(By.ID, "count")
    assert count.text == "5 of 5 wheels"
    # The install lines name the index the page was loaded from: the doctor's text.
    url = f"{served.url}cu130-torch2.14-sm90/simple/"
    assert _line(browser, SM90) == _doctor_text("pip", url, "fa-demo",
                                                "fa-demo==1.0+cu130torch2.14sm90")
    box = browser.find_element(By.ID, "filter")
    box.send_keys("sm_100 2.14")
    assert sorted(_visible(browser)) == [SM100_ARM, SM100]
    box.send_keys(" x86_64")
    assert _visible(browser) == [SM100]
    assert count.text == "1 of 5 wheels"
    box.clear()
    box.send_keys("no-such-thing")
    assert _visible(browser) == [] and count.text == "0 of 5 wheels"


def test_gpu_product_names_find_the_wheels_that_run_on_them(browser: Any,
                                                             served: RunningServer) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, served.url + "finder/")
    box = browser.find_element(By.ID, "filter")
    box.send_keys("B200")
    # sm_100 builds (both CPUs, both torch minors), and the pure-Python wheel runs anywhere
    assert sorted(_visible(browser)) == sorted([SM100, SM100_ARM, CU128, OTHER])
    note = browser.find_element(By.ID, "gpu-note").text
    assert note.startswith("B200 is sm_100 (compute capability 10.0)")
    # each arch cell names the GPUs it runs on
    arch = browser.find_element(By.CSS_SELECTOR, f"tbody[title='{SM100}'] td[data-key=arch]")
    assert arch.get_attribute("title").startswith("runs on: B200, B100, GB200, B300, GB300")
    box.clear()
    box.send_keys("rtx pro 6000 fa-demo")  # sm_120: nothing here was built for it
    assert _visible(browser) == []
    assert browser.find_element(By.ID, "gpu-note").text.startswith("RTX PRO 6000 is sm_120")
    box.clear()
    box.send_keys("h100 x86")
    assert _visible(browser) == [SM90]


def test_the_view_is_in_the_url_and_a_shared_url_opens_it(browser: Any,
                                                          served: RunningServer) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, served.url + "finder/")
    browser.find_element(By.ID, "filter").send_keys("gb200 aarch64")
    size = browser.find_element(By.CSS_SELECTOR, "th[data-key=size] button")
    size.click()
    size.click()  # descending
    browser.find_element(By.CSS_SELECTOR, "input[name=installer][value=uv]").click()
    shared = browser.current_url
    assert "q=gb200+aarch64" in shared and "sort=size-desc" in shared and "with=uv" in shared
    _open(browser, served.url + "finder/")  # a fresh page: nothing set
    assert len(_visible(browser)) == 5
    _open(browser, shared)
    assert browser.find_element(By.ID, "filter").get_attribute("value") == "gb200 aarch64"
    assert _visible(browser) == [SM100_ARM]
    header = browser.find_element(By.CSS_SELECTOR, "th[data-key=size]")
    assert header.get_attribute("aria-sort") == "descending"
    url = f"{served.url}cu130-torch2.14-sm100/simple/"
    assert _line(browser, SM100_ARM) == _doctor_text("uv", url, "fa-demo",
                                                     "fa-demo==1.0+cu130torch2.14sm100")


def test_columns_sort_as_their_values(browser: Any, served: RunningServer) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, served.url + "finder/")

    def column(key: str) -> list[str]:
        return [r.find_element(By.CSS_SELECTOR, f"td[data-key={key}]").get_attribute("data-sort")
                or r.find_element(By.CSS_SELECTOR, f"td[data-key={key}]").text
                for r in browser.find_elements(By.CSS_SELECTOR, "#wheels tbody.wheel")]

    button = browser.find_element(By.CSS_SELECTOR, "th[data-key=torch] button")
    button.click()
    torch = [r.find_element(By.CSS_SELECTOR, "td[data-key=torch]").text
             for r in browser.find_elements(By.CSS_SELECTOR, "#wheels tbody.wheel")]
    assert torch == ["", "2.11", "2.14", "2.14", "2.14"]
    button.click()
    assert column("torch") == sorted(column("torch"), reverse=True)
    browser.find_element(By.CSS_SELECTOR, "th[data-key=size] button").click()
    sizes = [int(v) for v in column("size")]
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("fmt", ["pip", "uv", "poetry", "pdm"])
def test_every_installer_gets_the_doctors_text(browser: Any, served: RunningServer,
                                               fmt: str) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, served.url + "finder/")
    browser.find_element(By.CSS_SELECTOR, f"input[name=installer][value={fmt}]").click()
    url = f"{served.url}cu128-torch2.11-sm100/simple/"
    want = _doctor_text(fmt, url, "fa-demo", "fa-demo==1.0+cu128torch2.11sm100")
    assert _line(browser, CU128) == want


def test_copy_puts_the_line_on_the_clipboard(browser: Any, served: RunningServer) -> None:
    """Over http by host name the page is no secure context (no clipboard API): the fallback
    copies as well; the pasted text is the line."""
    import socket

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    by_name = served.url.replace("127.0.0.1", socket.gethostname())
    _open(browser, by_name + "finder/")
    assert browser.execute_script("return window.isSecureContext") is False
    row = browser.find_element(By.CSS_SELECTOR, f"tbody[title='{SM90}']")
    button = row.find_element(By.CSS_SELECTOR, "button.copy")
    button.click()
    assert button.text == "copied"
    box = browser.find_element(By.ID, "filter")
    box.clear()
    box.send_keys(Keys.CONTROL, "v")
    # a one-line input: the browser turns the comment's line break into a space when pasting
    assert box.get_attribute("value").split() == _line(browser, SM90).split()
    host = by_name.split("/")[2]
    assert _line(browser, SM90).splitlines()[-1].startswith(
        f"python3 -m pip install --trusted-host {host} --extra-index-url {by_name}")


def test_by_host_name_the_lines_trust_the_host_and_say_why(browser: Any,
                                                          served: RunningServer) -> None:
    """This machine's name resolves to loopback, but pip treats a name as a remote host: over
    plain http the page's lines carry --trusted-host (PDM's verify_ssl = false) and the comment
    why, as factory doctor prints them; by 127.0.0.1 they need none."""
    import socket

    from selenium.webdriver.common.by import By

    by_name = served.url.replace("127.0.0.1", socket.gethostname())
    _open(browser, by_name + "finder/")
    url = f"{by_name}cu130-torch2.14-sm90/simple/"
    line = _line(browser, SM90)
    assert line == _doctor_text("pip", url, "fa-demo", "fa-demo==1.0+cu130torch2.14sm90")
    assert "unless told to trust it" in line.splitlines()[0]
    browser.find_element(By.CSS_SELECTOR, "input[name=installer][value=pdm]").click()
    assert "verify_ssl = false" in _line(browser, SM90)
    _open(browser, served.url + "finder/")
    assert "--trusted-host" not in _line(browser, SM90)


def test_links_lead_to_the_wheel_its_project_page_and_its_variant_index(
        browser: Any, served: RunningServer) -> None:
    import urllib.request

    from selenium.webdriver.common.by import By

    _open(browser, served.url + "finder/")
    row = browser.find_element(By.CSS_SELECTOR, f"tbody[title='{SM100}']")
    wheel = row.find_element(By.CSS_SELECTOR, "a.wheel-link").get_attribute("href")
    project = row.find_element(By.CSS_SELECTOR, "td[data-key=package] a").get_attribute("href")
    variant = row.find_element(By.CSS_SELECTOR, "a.variant-link").get_attribute("href")
    assert variant == served.url + "cu130-torch2.14-sm100/simple/"
    assert project == variant + "fa-demo/"
    with urllib.request.urlopen(wheel, timeout=30) as resp:
        assert resp.status == 200 and resp.read(2) == b"PK"
    with urllib.request.urlopen(project, timeout=30) as resp:
        assert SM100.encode() in resp.read()
    with urllib.request.urlopen(variant, timeout=30) as resp:
        assert b"fa-demo" in resp.read()
    doctor = browser.find_element(By.ID, "doctor-line").text
    assert doctor == f"factory doctor --index {served.url}"


@pytest.mark.parametrize(("width", "phone"), [(1100, False), (390, True)])
def test_the_layout_holds_at_1100_px_and_on_a_phone(browser: Any, served: RunningServer,
                                                    width: int, phone: bool) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, served.url + "finder/", width)
    if phone:
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": 844, "deviceScaleFactor": 3, "mobile": True})
        browser.get(served.url + "finder/")
    browser.find_element(By.CSS_SELECTOR, "input[name=installer][value=poetry]").click()
    fits = browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth")
    assert fits, browser.execute_script("return [document.documentElement.scrollWidth, "
                                        "window.innerWidth]")
    head = browser.find_element(By.CSS_SELECTOR, "#wheels thead")
    assert head.is_displayed() is (not phone)
    for pre in browser.find_elements(By.CSS_SELECTOR, "pre.install-text"):
        right = pre.rect["x"] + pre.rect["width"]
        assert right <= width + 1
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_the_page_works_from_a_static_copy(browser: Any, store: LocalStore,
                                           tmp_path: Path) -> None:
    """file:// stands in for S3/CDN: no server logic, the page still fills in and filters."""
    from selenium.webdriver.common.by import By

    copy = tmp_path / "copy"
    shutil.copytree(store.root, copy)
    _open(browser, (copy / FINDER_KEY).as_uri())
    assert _line(browser, CU128).startswith(
        f"python3 -m pip install --extra-index-url {copy.as_uri()}/cu128-torch2.11-sm100/simple/")
    browser.find_element(By.ID, "filter").send_keys("other")
    assert _visible(browser) == [OTHER]


def test_versions_sort_as_versions_not_as_text(browser: Any, tmp_path: Path) -> None:
    """torch 2.9 before 2.14, 2.8.3.post2 after 2.8.3 and before 2.10 (text would not)."""
    from selenium.webdriver.common.by import By

    from factory.index.finder import FinderRow, finder_html

    names = ["fa-2.10.0+cu130torch2.14-cp311-cp311-linux_x86_64.whl",
             "fa-2.8.3.post2+cu130torch2.9-cp311-cp311-linux_x86_64.whl",
             "fa-2.8.3+cu128torch2.9-cp311-cp311-linux_x86_64.whl"]
    page = tmp_path / "finder" / "index.html"
    page.parent.mkdir()
    page.write_bytes(finder_html([FinderRow(project="fa", filename=n, size=1000 * (i + 1),
                                            uploaded=f"2026-12-0{i + 1}T00:00:00Z",
                                            yanked=False) for i, n in enumerate(names)]))
    _open(browser, page.as_uri())

    def texts(key: str) -> list[str]:
        return [r.find_element(By.CSS_SELECTOR, f"td[data-key={key}]").text
                for r in browser.find_elements(By.CSS_SELECTOR, "#wheels tbody.wheel")]

    browser.find_element(By.CSS_SELECTOR, "th[data-key=torch] button").click()
    assert texts("torch") == ["2.9", "2.9", "2.14"]
    browser.find_element(By.CSS_SELECTOR, "th[data-key=version] button").click()
    assert texts("version") == ["2.8.3+cu128torch2.9", "2.8.3.post2+cu130torch2.9",
                                "2.10.0+cu130torch2.14"]
