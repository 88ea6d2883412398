"""The toolkit a build sees: the real CUDA toolkit behind the factory's compiler wrappers.

Every build gets a toolkit directory of its own (``CUDA_HOME``): links to the real toolkit's
entries, except ``bin/nvcc``, which is the factory's nvcc wrapper (``compilers.py``), and
``bin/factory-c++``, the host C++ wrapper (``CXX``, where the cell's C++ standard needs raising).
So every path to nvcc a build system takes (torch's ninja file, its non-ninja compile, CMake,
``nvcc`` on PATH) goes through the wrapper, and the cell's archs are what nvcc compiles.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from . import compilers
from .log import Log
from .steps import which

NVCC_NAME = "nvcc"
CXX_NAME = "factory-c++"


def toolkit_root(cuda_home: str | None) -> Path:
    """The CUDA toolkit torch's build will use, found the way torch.utils.cpp_extension finds it:
    the job's CUDA home, else CUDA_HOME / CUDA_PATH, else the nvcc on PATH, else /usr/local/cuda."""
    home = cuda_home or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = which("nvcc", os.environ.get("PATH", ""))
    return Path(nvcc).parent.parent if nvcc else Path("/usr/local/cuda")


def _wrapper_text(python: str) -> str:
    source = compilers.__loader__.get_source(compilers.__name__)  # type: ignore[union-attr]
    assert source is not None
    return f"#!{python} -IS\n{source}"


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def install(spec: dict[str, Any], *, real: Path, python: str, log: Log | None,
            seen_as: Path | None = None) -> tuple[Path, Path]:
    """Make the build's toolkit at ``spec['dir']`` (replacing an older one) in front of the real
    toolkit ``real``. ``seen_as``: where the build will see ``real`` when that is not here (a
    container that mounts it elsewhere); the links point there. Returns (the toolkit dir, the
    host C++ wrapper)."""
    home = Path(spec["dir"])
    if home.is_symlink() or home.is_file():
        home.unlink()
    elif home.exists():
        shutil.rmtree(home)
    (home / "bin").mkdir(parents=True)
    def target(entry: Path) -> Path:
        return seen_as / entry.relative_to(real) if seen_as else entry.resolve()

    for entry in sorted(real.iterdir()):
        if entry.name != "bin":
            (home / entry.name).symlink_to(target(entry))
    real_bin = real / "bin"
    for entry in sorted(real_bin.iterdir()) if real_bin.is_dir() else ():
        if entry.name != NVCC_NAME:
            (home / "bin" / entry.name).symlink_to(target(entry))
    text = _wrapper_text(python)
    _write(home / "bin" / NVCC_NAME, text)
    _write(home / "bin" / CXX_NAME, text)
    if log is not None:
        sm = ", ".join(f"sm_{a}" for a in spec["archs"])
        std = f"; C++{spec['cxx_std']} for host and device code" if spec.get("cxx_std") else ""
        log.line(f"factory: nvcc compiles {sm} only (targets outside dropped){std}: "
                 f"{home / 'bin' / NVCC_NAME} in front of {real_bin / NVCC_NAME}")
    return home, home / "bin" / CXX_NAME


def environment(spec: dict[str, Any], *, home: Path, cxx_wrapper: Path, real: Path,
                nvcc_next: list[str], extra: dict[str, str], log_path: str,
                cxx: str | None = None) -> None:
    """The variables that route the build's compilers through the wrappers: CUDA_HOME and
    PATH to the build's toolkit, what each wrapper runs next (``cxx``: the host C++ compiler
    the build would use, default $CXX or c++), and the cell's settings. Paths as the build
    sees them."""
    real_nvcc = str(real / "bin" / NVCC_NAME)
    extra["CUDA_HOME"] = str(home)
    extra["FACTORY_REAL_NVCC"] = real_nvcc
    extra["PYTORCH_NVCC"] = str(home / "bin" / NVCC_NAME)
    extra["FACTORY_NVCC_NEXT"] = shlex.join(nvcc_next or [real_nvcc])
    extra["FACTORY_CELL_ARCHS"] = ",".join(str(a) for a in spec["archs"])
    extra["FACTORY_COMPILER_LOG"] = log_path
    if spec.get("cxx_std"):
        extra["FACTORY_CXX_STD"] = str(spec["cxx_std"])
        extra["FACTORY_CXX_NEXT"] = cxx or extra.get("CXX") or os.environ.get("CXX") or "c++"
        extra["CXX"] = str(cxx_wrapper)
