"""docker/install-factory.sh (the install part of docker/setup-host.sh) on a stock Debian 12
python3, whose pip refuses system installs (PEP 668): the project must land in a venv of its own
and `factory` on the PATH. Runs in a fresh container of the bookworm base image (Debian's own
python3, no network): the project's runtime dependencies are downloaded on the host once and
installed from that directory with --no-index."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, cache_root

from factory.tomlread import tomllib

pytestmark = [pytest.mark.docker, pytest.mark.download]


# bookworm's glibc is 2.36; pip matches --platform exactly, so name the tags its wheels use
_PLATFORMS = [
    arg
    for tag in (
        "manylinux_2_36_x86_64",
        "manylinux_2_28_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux_2_5_x86_64",
        "manylinux1_x86_64",
    )
    for arg in ("--platform", tag)
]


def _runtime_deps_dir() -> Path:
    """The project's runtime dependencies (and its build backend) as wheels, kept in the test
    cache; downloaded once with the host's pip (same Python minor as bookworm: 3.11)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    dest = cache_root() / "setup-host-deps"
    marker = dest / ".complete"
    if marker.exists() and marker.read_text() == "\n".join(reqs):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--only-binary",
            ":all:",
            "--python-version",
            "3.11",
            *_PLATFORMS,
            "-d",
            str(dest),
            *reqs,
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot download the project's dependencies: {r.stderr.strip()[-300:]}")
    marker.write_text("\n".join(reqs))
    return dest


def _project_copy(dest: Path) -> Path:
    """What a fresh clone holds that the install reads (the tree is written into: egg-info)."""
    for name in ("factory", "docker", "tests/example_ext"):
        shutil.copytree(
            REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    for name in ("pyproject.toml", "README.md", "matrix.toml"):
        shutil.copy2(REPO / name, dest / name)
    return dest


def test_install_on_stock_debian_python(
    base_image: str, tmp_path: Path, docker_engine: Any
) -> None:
    deps = _runtime_deps_dir()
    src = _project_copy(tmp_path / "src")
    script = (
        # the system pip refuses, as on a stock Debian 12 host: the reason the venv exists
        "python3 -m pip install --no-index --find-links /deps tomli-w; echo system-pip-rc=$?; "
        "bash /src/docker/install-factory.sh && cd / && "
        "echo on-path=$(command -v factory) && echo link=$(readlink /usr/local/bin/factory) && "
        "factory --version && "
        "factory matrix --matrix /src/matrix.toml --package factory-example-ext"
    )
    r = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{src}:/src",
            "-v",
            f"{deps}:/deps:ro",
            "-e",
            "PIP_NO_INDEX=1",
            "-e",
            "PIP_FIND_LINKS=/deps",
            "-e",
            "FACTORY_EXTRAS=",
            base_image,
            "bash",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "externally-managed-environment" in out and "system-pip-rc=1" in out, out[-3000:]
    assert "on-path=/usr/local/bin/factory" in out
    assert "link=/src/.venv/bin/factory" in out
    assert "factory 0.1.0" in out
    assert "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311" in out
    assert "1 cell(s)" in out
