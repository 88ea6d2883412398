"""Every index URL the docs show (README.md and every doc with install lines: docs/INDEX.md,
docs/DEPLOY.md, docs/RECIPES.md) is one the index serves: an index holding a build of every cell
of the default matrix is served, and each URL, its host mapped to the served one, is fetched.
Every documented pip line is the doctor's own (exact build, --trusted-host with the port over
plain http by name, --cert for a private CA), and its exact build is on the page its URL names. (docs/DEPLOY.md once sent hosts to /cu130-torch2.14/simple/, a 404: the
builds are under /cu130-torch2.14-sm100/simple/.)"""

from __future__ import annotations

import re
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ops_builds import REPO, factory_cli, planned, publish_build

from factory.hosts.choose import Choice
from factory.hosts.index_reader import IndexAccess
from factory.hosts.snippets import pip_command
from factory.index.server import RunningServer, running_server

pytestmark = pytest.mark.integration

DOCS = [REPO / "README.md", *(REPO / "docs" / name for name in ("INDEX.md", "DEPLOY.md",
                                                                 "RECIPES.md"))]
# The index hosts the docs name, and credentials some of them carry.
_URL = re.compile(r"https?://(?:[^@/\s]+@)?(?:INDEX-HOST:8080|HOST:8080|index\.example\.com)"
                  r"(?:/[^\s\"'`)<>]*)?")
_PATH = re.compile(r"`(/(?:[a-z0-9.-]+/)?simple/(?:[a-z0-9.-]+/|index\.html)?)`")
_PIP = re.compile(r"--extra-index-url (\S+) ([a-z0-9-]+)==(\S+)")


def _documented() -> dict[str, set[str]]:
    """path below the index root -> the docs that show it."""
    out: dict[str, set[str]] = {}
    for doc in DOCS:
        text = doc.read_text()
        paths = [urllib.parse.urlsplit(u).path or "/" for u in _URL.findall(text)]
        paths += _PATH.findall(text)
        for path in paths:
            out.setdefault(path, set()).add(doc.name)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A build of every cell of the default matrix, published, with the wheel-variants tree."""
    tmp = tmp_path_factory.mktemp("docs")
    store = tmp / "store"
    for pc in planned(REPO / "matrix.toml"):
        plat = pc.wheel.removesuffix(".whl").rsplit("-", 1)[-1]
        publish_build(store, tmp / "dist", pc, plat=plat)
    r = factory_cli("index", "wheel-variants", "--store", str(store))
    assert r.returncode == 0, r.stderr
    with running_server(store) as server:
        yield server


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_every_documented_url_is_served(served: RunningServer) -> None:
    documented = _documented()
    assert {"/", "/cu130-torch2.14-sm100/simple/", "/simple/", "/finder/"} <= set(documented)
    missing = []
    for path, docs in sorted(documented.items()):
        status, _ = _get(served.url.rstrip("/") + path)
        if status != 200:
            missing.append(f"{path} ({', '.join(sorted(docs))}): HTTP {status}")
    assert not missing, "documented but not served:\n" + "\n".join(missing)


def test_every_documented_pip_line_names_a_build_on_its_page(served: RunningServer) -> None:
    lines = [(doc.name, m) for doc in DOCS for m in _PIP.finditer(doc.read_text())]
    assert len(lines) >= 3
    for doc, m in lines:
        url, project, version = m.groups()
        page = served.url.rstrip("/") + urllib.parse.urlsplit(url).path + f"{project}/"
        status, body = _get(page)
        assert status == 200, f"{doc}: {page}: HTTP {status}"
        file_version = urllib.parse.quote(version.replace("-", "_"))
        assert f"-{file_version}-".encode() in body, f"{doc}: {project}=={version} not on {page}"


def _pip_lines(text: str) -> list[str]:
    """The documented pip commands that use an index (a report's line, a snippet's `# run:`)."""
    lines = [ln.strip().removeprefix("# run: ") for ln in text.splitlines()]
    return [ln for ln in lines if re.match(r"(python3 -m )?pip install ", ln)
            and "index-url" in ln]


def _doctors_line(line: str) -> str:
    """What the doctor prints for the URL, requirement and CA bundle the line names."""
    m = re.search(r"--extra-index-url (\S+) (\S+)$", line)
    assert m, line
    url, requirement = m.groups()
    cert = re.search(r"--cert (\S+)", line)
    root = url.split("/simple/")[0].rsplit("/", 1)[0] + "/"
    choice = Choice(project=requirement.split("==")[0], wheel="x.whl", variant=None, why=None,
                    index_url=url, requirement=requirement)
    access = IndexAccess(url=root, cert=Path(cert.group(1)) if cert else None)
    return pip_command([choice], access, "python3")[-1]


def test_every_documented_pip_line_is_the_doctors() -> None:
    lines = [(doc.name, ln) for doc in DOCS for ln in _pip_lines(doc.read_text())]
    assert {"README.md", "INDEX.md", "DEPLOY.md", "RECIPES.md"} <= {doc for doc, _ in lines}
    for doc, line in lines:
        line = line.replace("INDEX-HOST", "index-host")  # a host name as urllib spells it
        assert line == _doctors_line(line), f"{doc}: {line}"
    # what the check refuses: the line RECIPES.md had (no exact build, no port to trust)
    old = ("pip install --extra-index-url http://INDEX-HOST:8080/cu130-torch2.14-sm100/simple/ "
           "--trusted-host INDEX-HOST factory-example-ext")
    with pytest.raises(AssertionError):
        assert old == _doctors_line(old)


def test_the_check_finds_a_wrong_url(served: RunningServer) -> None:
    """The 404 the docs had: the variant without its arch set."""
    assert _get(served.url + "cu130-torch2.14/simple/")[0] == 404
    assert _get(served.url + "cu130-torch2.14-sm100/simple/")[0] == 200


@pytest.fixture(scope="module")
def flash_attn_by_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The default matrix's flash-attn builds, served and reached by this machine's name."""
    tmp = tmp_path_factory.mktemp("docs-fa")
    for pc in planned(REPO / "matrix.toml"):
        if pc.cell.package == "flash-attn":
            plat = pc.wheel.removesuffix(".whl").rsplit("-", 1)[-1]
            publish_build(tmp / "store", tmp / "dist", pc, plat=plat)
    with running_server(tmp / "store") as server:
        yield server.url.replace("127.0.0.1", socket.gethostname())


@pytest.mark.parametrize("fmt", ["report", "pip", "uv", "poetry", "pdm"])
def test_docs_show_what_the_doctor_prints(flash_attn_by_name: str, fmt: str,
                                          tmp_path: Path) -> None:
    """docs/INDEX.md's examples (a B200 with torch 2.14.1+cu130, the index by host name over
    http) are the real doctor's output, with the host written INDEX-HOST:8080."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)  # the host's python3
    torch = tmp_path / "torch" / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text('__version__ = "2.14.1+cu130"\nfrom . import version\n')
    (torch / "version.py").write_text('cuda = "13.0"\n')
    r = factory_cli("doctor", "--index", flash_attn_by_name, "--nvidia-smi-output",
                    str(REPO / "tests/data/doctor/b200.txt"),
                    *([] if fmt == "report" else ["--format", fmt]),
                    env={"PYTHONPATH": str(torch.parent), "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.replace(flash_attn_by_name.split("/")[2], "INDEX-HOST:8080")
    if fmt == "report":
        out = "\n".join(out.splitlines()[out.splitlines().index(
            next(ln for ln in out.splitlines() if ln.startswith("flash-attn: "))):]) + "\n"
    assert out in (REPO / "docs" / "INDEX.md").read_text(), out
