"""A real build of the bundled example cell through cibuildwheel, in the factory's own offline
image (official manylinux images cannot be pulled here); the wheel passes the same verify as
every runner's (docs/GLIBC.md, cibuildwheel)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE_CELL, REPO, cache_root, write_example_matrix
from tools import tool


@pytest.mark.docker
@pytest.mark.slow
def test_cibuildwheel_builds_the_example_offline_and_it_verifies(
    tmp_path: Path, base_image: str, wheelhouse_cp311: Path, cuda13_home: Path
) -> None:
    tool("cibuildwheel")
    matrix = write_example_matrix(tmp_path / "matrix.toml", work_dir=cache_root() / "work")
    out = tmp_path / "out"
    build = subprocess.run(
        [sys.executable, "-m", "factory", "build", EXAMPLE_CELL, "--matrix", str(matrix),
         "--runner", "cibuildwheel", "--no-import-check", "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "CI": "true"}, cwd=REPO, timeout=3000,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    (log,) = re.findall(r"log (\S+attempt-1\.log)", build.stderr)
    assert "Starting container image factory-base:bookworm-cibw" in Path(log).read_text()
    (wheel,) = out.glob("*.whl")
    assert wheel.name.endswith("-manylinux_2_28_x86_64.whl")
    manifest = json.loads(wheel.with_name(wheel.name + ".provenance.json").read_text())
    assert manifest["builder"]["runner"] == "cibuildwheel"
    reached = tuple(int(x) for x in manifest["floor"]["reached"]["glibc"].split("."))
    assert reached <= (2, 28)
    # the same verify as every wheel (the build ran it; run it again from the CLI)
    verify = subprocess.run(
        [sys.executable, "-m", "factory", "verify", str(wheel), "--no-import", "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    checks = {c["name"]: c["status"] for c in json.loads(verify.stdout)["wheels"][0]["checks"]}
    assert checks["archs"] == checks["glibc"] == checks["platform"] == "pass"
