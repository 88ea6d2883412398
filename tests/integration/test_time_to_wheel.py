"""A new torch release becomes an installable wheel with no edit to the matrix: the nightly's
real commands against a PyPI stand-in on loopback (tests/time_to_wheel.py). torch 2.99.0
appears between two nightlies; the next one locks its cell, builds it for real in docker (the
compile cache holds its kernels: its headers are 2.14.1's), publishes it, and pip installs it
from the served index into a clean venv, where it imports. A nightly with nothing new builds
nothing and leaves the lock as it was.

One real build: the cell of the torch already there stands for last night's build (a small
wheel published under its name and content key), so it is not built again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import cache_root
from ops_builds import publish_build
from time_to_wheel import NEW_TORCH, PACKAGE, installed, standin_setup

from factory.matrix.load import load_matrix
from factory.matrix.lock import lock_path, read_lock

pytestmark = [pytest.mark.docker, pytest.mark.slow]

OLD_CELL = f"{PACKAGE}-0.1.0-torch2.14.1-cu130-sm100-cp311"
NEW_CELL = f"{PACKAGE}-0.1.0-torch{NEW_TORCH}-cu130-sm100-cp311"
NEW_WHEEL = "factory_example_ext-0.1.0+cu130torch2.99sm100-cp311-cp311-manylinux_2_28_x86_64.whl"


def _files(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in (store / "files").rglob("*") if p.is_file())


def test_a_torch_release_becomes_a_wheel_and_a_quiet_night_builds_nothing(
        tmp_path: Path, base_image: str, wheelhouse_cp311: Path, cuda13_home: Path,
        venv_root: Path, no_leftover_containers: Any) -> None:
    cache = cache_root() / "time-to-wheel"
    with standin_setup(wheelhouse=wheelhouse_cp311.parent, cache=cache, venvs=venv_root,
                       root=tmp_path) as s:
        # Last night: torch 2.14.1 was the newest; its cell was locked and built.
        lock = s.factory("lock", "lock", "--matrix", str(s.matrix)).check()
        assert f"add     {OLD_CELL} " in lock.stdout
        locked = read_lock(lock_path(s.matrix))
        assert locked is not None and [c.id for c in locked.cells] == [OLD_CELL]
        real = s.standin.find("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl")
        assert real is not None and locked.cells[0].torch_sha256 == real.sha256
        publish_build(s.store, tmp_path / "last-night", load_matrix(s.matrix).find(OLD_CELL))

        # Tonight torch 2.99.0 is on the index, and the nightly runs as it always does.
        s.release(cache)
        lock, build, _index = s.nightly()
        assert f"add     {NEW_CELL} " in lock.stdout and "drop" not in lock.stdout
        assert "wrote matrix.lock: 2 cell(s)" in lock.stdout
        assert "1 cell(s) of the matrix are not in" in build.stderr
        assert f"built     {NEW_CELL}" in build.stderr
        assert f"files/factory-example-ext/{NEW_WHEEL}" in _files(s.store)
        with s.served() as index:
            install = s.install(index).check()
        got = installed(install)
        assert got["torch"] == NEW_TORCH
        assert got[PACKAGE] == "0.1.0+cu130torch2.99sm100"
        # installed into a clean venv, it imports: its operators registered with that torch
        assert install.imported == f"{NEW_TORCH} 0.1.0+cu130torch2.99sm100 add scale relu square"

        # The next night: nothing new. The lock stays byte for byte, nothing is built.
        before, published = lock_path(s.matrix).read_bytes(), _files(s.store)
        lock, build, _index = s.nightly()
        assert "matrix.lock is current: 2 cell(s)" in lock.stdout
        assert lock_path(s.matrix).read_bytes() == before
        assert "0 cell(s) of the matrix are not in" in build.stderr
        assert "built " not in build.stderr
        assert _files(s.store) == published
