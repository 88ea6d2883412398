"""`factory lock` against the real PyPI: `torch = ["latest:2"]` pins two torch minors, each with
the sha256 of the torch wheel its cell installs and flash-attn's newest sdist with its sha256,
checked against PyPI's JSON API (another endpoint than the simple pages the lock reads)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from ops_builds import factory_cli

from factory.matrix.lock import lock_path, read_lock

pytestmark = [pytest.mark.download]


def _pypi_json(project: str, version: str) -> dict[str, str]:
    """filename -> sha256 of one release, from https://pypi.org/pypi/<project>/json."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{project}/json", timeout=120) as resp:
        doc = json.load(resp)
    return {u["filename"]: u["digests"]["sha256"] for u in doc["releases"][version]}


def test_latest_2_pins_two_torch_minors_with_their_hashes(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(f"""\
version = 1
[settings]
work-dir = "{tmp_path / 'work'}"
[indexes]
pypi = "https://pypi.org/simple/"
[axes]
torch = ["latest:2"]
cuda = ["default"]
archs = [["10.0"]]
python = ["3.12"]
platform = ["x86_64", "aarch64"]
[packages.flash-attn]
recipe = "flash-attn"
versions = ["latest"]
""")
    r = factory_cli("lock", "--matrix", str(matrix), env={"FACTORY_FACTS": ""}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lock = read_lock(lock_path(matrix))
    assert lock is not None
    minors = {".".join(c.torch.split(".")[:2]) for c in lock.cells}
    assert len(minors) == 2, f"latest:2 gave {sorted(minors)}"
    assert {c.platform for c in lock.cells} == {"x86_64", "aarch64"}
    assert len(lock.cells) == 4
    for cell in lock.cells:
        assert cell.torch_index == "pypi" and cell.cuda_release
        files = _pypi_json("torch", cell.torch)
        assert cell.torch_wheel in files, f"{cell.torch_wheel} is not a file of torch {cell.torch}"
        assert cell.torch_sha256 == files[cell.torch_wheel]
        sdists = _pypi_json("flash-attn", cell.version)
        assert cell.sdist in sdists and cell.sha256 == sdists[cell.sdist]
    # the facts say where they came from: PyPI's pages and the wheels' metadata
    sources = " ".join(f.origin.source for f in lock.facts)
    assert "https://pypi.org/simple/torch/" in sources and ".whl.metadata" in sources
