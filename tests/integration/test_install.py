"""Real installs from the served index into fresh venvs, with pip and with uv.

The fake packages: ``fa-demo`` in two variants (``+cu130torch2.13`` pinning ``torch==2.13.*``,
``+cu130torch2.14`` pinning ``torch==2.14.*``), fake ``torch`` 2.13.0 and 2.14.1 in the same
index, ``yk-demo`` whose newest file is yanked, and ``tp-demo`` whose file is changed after it
was indexed. A "host with torch 2.X" is a venv where the fake torch 2.X was installed first.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from index_fixtures import installer_env, uv_bin
from index_wheels import make_wheel, variant_wheel

from factory.index.publish import publish, yank
from factory.index.server import RunningServer, running_server
from factory.store import LocalStore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("install")
    store = LocalStore(tmp / "store")
    wheels = [variant_wheel(tmp / "w", "fa-demo", "1.0.0", t) for t in ("2.13", "2.14")]
    wheels += [make_wheel(tmp / "w", "torch", v) for v in ("2.13.0", "2.14.1")]
    wheels += [make_wheel(tmp / "w", "yk-demo", v) for v in ("1.0", "1.1")]
    wheels.append(make_wheel(tmp / "w", "tp-demo", "1.0"))
    publish(store, wheels)
    yank(store, "yk_demo-1.1-py3-none-any.whl", "broken on purpose")
    # A valid wheel of the same name swapped in after indexing: only the hash can tell.
    swapped = make_wheel(
        tmp / "swap", "tp-demo", "1.0", extra_members={"tp_demo/evil.py": b"raise SystemExit\n"}
    )
    store.path("files/tp-demo/tp_demo-1.0-py3-none-any.whl").write_bytes(swapped.read_bytes())
    with running_server(store.root) as server:
        yield server, tmp


def _run(cmd: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=installer_env(tmp), timeout=300)


def _host(tmp: Path, name: str, server: RunningServer, torch: str | None) -> Path:
    """A fresh venv; with ``torch``, that fake torch is installed first (from the index)."""
    venv = tmp / name
    subprocess.run(
        [uv_bin(), "venv", "-q", "--python", sys.executable, str(venv)],
        check=True,
        env=installer_env(tmp),
        timeout=120,
    )
    python = venv / "bin" / "python"
    if torch:
        done = _run(
            [
                uv_bin(),
                "pip",
                "install",
                "-q",
                "--python",
                str(python),
                "--index-url",
                server.url + "simple/",
                f"torch=={torch}",
            ],
            tmp,
        )
        assert done.returncode == 0, done.stderr
    return python


def _pip(python: Path, url: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--no-cache-dir",
        "--index-url",
        url,
        *args,
    ]


def _uv(python: Path, url: str, *args: str) -> list[str]:
    return [
        uv_bin(),
        "pip",
        "install",
        "--no-cache",
        "--python",
        str(python),
        "--index-url",
        url,
        *args,
    ]


def _installed(python: Path, tmp: Path) -> dict[str, str]:
    out = _run([uv_bin(), "pip", "freeze", "--python", str(python)], tmp).stdout
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)


@pytest.mark.parametrize("tool", ["pip", "uv"])
@pytest.mark.parametrize("torch", ["2.13.0", "2.14.1"])
def test_host_gets_the_variant_pinned_to_its_torch(
    index: tuple[RunningServer, Path], tool: str, torch: str
) -> None:
    """With the host's torch on the install line, the resolver keeps it and backtracks to the
    variant whose ``torch==2.X.*`` pin fits. Without it, pip and uv both upgrade torch to fit
    the newest variant whenever an index offers a newer torch (PyPI does): docs/INDEX.md."""
    server, tmp = index
    python = _host(tmp, f"{tool}-{torch}", server, torch)
    make = _pip if tool == "pip" else _uv
    done = _run(make(python, server.url + "simple/", "fa-demo", f"torch=={torch}"), tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    minor = torch.rsplit(".", 1)[0]
    assert _installed(python, tmp) == {"fa-demo": f"1.0.0+cu130torch{minor}", "torch": torch}


def test_per_variant_url_gives_exactly_that_variant(index: tuple[RunningServer, Path]) -> None:
    server, tmp = index
    python = _host(tmp, "variant-pip", server, "2.14.1")
    done = _run(_pip(python, server.url + "cu130-torch2.14/simple/", "fa-demo"), tmp)
    assert done.returncode == 0, done.stderr
    assert _installed(python, tmp)["fa-demo"] == "1.0.0+cu130torch2.14"
    # The 2.13 tree has nothing else to offer a torch-2.14 host: the resolver must fail.
    python = _host(tmp, "variant-uv", server, "2.14.1")
    wrong = _run(_uv(python, server.url + "cu130-torch2.13/simple/", "fa-demo"), tmp)
    assert wrong.returncode != 0 and "fa-demo" not in _installed(python, tmp)
    right = _run(_uv(python, server.url + "cu130-torch2.14/simple/", "fa-demo"), tmp)
    assert right.returncode == 0, right.stderr
    assert _installed(python, tmp)["fa-demo"] == "1.0.0+cu130torch2.14"


@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_a_yanked_file_is_not_chosen(index: tuple[RunningServer, Path], tool: str) -> None:
    server, tmp = index
    python = _host(tmp, f"yank-{tool}", server, None)
    make = _pip if tool == "pip" else _uv
    done = _run(make(python, server.url + "simple/", "yk-demo"), tmp)
    assert done.returncode == 0, done.stderr
    assert _installed(python, tmp) == {"yk-demo": "1.0"}


@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_a_tampered_file_is_refused_by_the_hash_check(
    index: tuple[RunningServer, Path], tool: str
) -> None:
    server, tmp = index
    python = _host(tmp, f"tamper-{tool}", server, None)
    make = _pip if tool == "pip" else _uv
    done = _run(make(python, server.url + "simple/", "tp-demo"), tmp)
    assert done.returncode != 0
    assert "hash" in (done.stdout + done.stderr).lower()
    assert "tp-demo" not in _installed(python, tmp)


def test_unknown_names_are_not_looked_up_elsewhere(index: tuple[RunningServer, Path]) -> None:
    server, tmp = index
    python = _host(tmp, "unknown", server, None)
    before = server.stats.not_found
    done = _run(_pip(python, server.url + "simple/", "requests"), tmp)
    assert done.returncode != 0 and "requests" not in _installed(python, tmp)
    assert server.stats.not_found > before
