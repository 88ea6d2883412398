"""Old pips against the served index: the PEP 691 JSON pages must not break the pip that
Debian 12 ships (23.0.1, also the one CPython 3.11.2's ensurepip bundles), one of the hosts
the wheels are for. Its JSON parser read ``dist-info-metadata`` as a string and crashed on the
PEP 691 dict ("TypeError: unhashable type: 'dict'"); PEP 714 renamed the key to
``core-metadata``, which old pips ignore."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from client_fixtures import OLD_PIP
from conftest import cache_root
from index_wheels import variant_wheel

from factory.index.publish import publish
from factory.index.server import running_server
from factory.store import LocalStore

pytestmark = [pytest.mark.integration, pytest.mark.download]


@pytest.fixture(scope="module")
def old_pip() -> Path:
    venv = cache_root() / "clients" / f"pip-{OLD_PIP}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"pip=={OLD_PIP}"],
                       check=True)
        (venv / ".complete").write_text(OLD_PIP)
    return python


def test_debian12_pip_downloads_from_the_served_index(old_pip: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    wheel = variant_wheel(tmp_path, "fa-demo", "1.0", "2.14", archs="100")
    publish(store, [wheel])
    version = subprocess.run([str(old_pip), "-m", "pip", "--version"], capture_output=True,
                             text=True, check=True).stdout
    assert version.startswith(f"pip {OLD_PIP} ")
    with running_server(store.root) as server:
        r = subprocess.run(
            [str(old_pip), "-m", "pip", "download", "--no-deps", "--no-cache-dir",
             "--disable-pip-version-check", "--index-url",
             f"{server.url}cu130-torch2.14-sm100/simple/", "-d", str(tmp_path / "got"),
             "fa-demo"],
            capture_output=True, text=True,
        )
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == [wheel.name]
