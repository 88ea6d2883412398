"""Reproducible wheels: the bundled example cell built twice, each in a fresh build tree, gives
byte-identical wheels, so rebuilding a published cell with --force --publish ends as
'unchanged' instead of a conflict. Two real builds: the session's default build of the example
(conftest.example_build) and one more here; they share the session's wheelhouse, venvs and CUDA
toolkit (not the compiler's work: each tree compiles every object)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE_CELL, REPO, ExampleBuild, cache_root, write_example_matrix

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _tree(root: Path, store: Path) -> Path:
    """A fresh work dir whose toolkits (beside it) are the session's."""
    root.mkdir()
    (root / "toolkits").symlink_to(cache_root() / "toolkits")
    return write_example_matrix(root / "matrix.toml", work_dir=root / "work", store=store)


def _build(matrix: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "factory",
            "build",
            EXAMPLE_CELL,
            "--matrix",
            str(matrix),
            "--out",
            str(out),
            "--no-import-check",
            "--memory",
            "8g",
            "--publish",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1800,
        env={**os.environ, "CI": "true"},
    )


def test_the_example_built_twice_in_fresh_trees_is_byte_identical(
    tmp_path: Path,
    example_build: ExampleBuild,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FACTORY_MEMORY_HISTORY", str(tmp_path / "history.json"))
    # the first build: the session's, published to its store from a fresh tree, same flags
    wheel_a = example_build.wheel
    second = _build(_tree(tmp_path / "b", example_build.store), tmp_path / "b" / "dist",
                    "--force")
    assert second.returncode == 0, second.stderr[-3000:]
    (wheel_b,) = (tmp_path / "b" / "dist").glob("*.whl")
    if wheel_a.read_bytes() != wheel_b.read_bytes():
        from factory.wheels.compare import compare_wheels

        pytest.fail("; ".join(f"{d.name}: {d.why}" for d in compare_wheels(wheel_a, wheel_b)))
    log = second.stdout + second.stderr
    assert f"unchanged: the store already has {wheel_b.name}" in log
    assert f"unchanged {EXAMPLE_CELL}" in log and str(wheel_b) in log  # the summary says where
