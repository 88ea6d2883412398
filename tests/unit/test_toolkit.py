"""A CUDA_HOME from NVIDIA's PyPI component wheels, a system path, or the image."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from factory.toolchain import toolkit
from factory.errors import ToolchainError


def test_image_source_has_no_home(example_cell: Any, tmp_path: Path) -> None:
    tc = dataclasses.replace(example_cell.toolchain, nvcc_source="image", image="factory-cuda:13.0")
    assert toolkit.materialize_cuda_home(tc, tmp_path) is None
    assert not list(tmp_path.iterdir())


def _fake_system_toolkit(root: Path, release: str) -> Path:
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    return root


def test_system_source_is_checked_against_the_cell(example_cell: Any, tmp_path: Path) -> None:
    good = _fake_system_toolkit(tmp_path / "good", "13.0")
    tc = dataclasses.replace(example_cell.toolchain, nvcc_source="system", system_path=str(good))
    assert toolkit.materialize_cuda_home(tc, tmp_path / "cache") == good

    bad = _fake_system_toolkit(tmp_path / "bad", "12.4")
    tc = dataclasses.replace(tc, system_path=str(bad))
    with pytest.raises(ToolchainError, match="CUDA 12.4, the cell needs 13.0") as info:
        toolkit.materialize_cuda_home(tc, tmp_path / "cache")
    assert "\n" not in info.value.message
