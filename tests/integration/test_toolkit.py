"""A CUDA_HOME from NVIDIA's PyPI component wheels, a system path, or the image."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from factory.process import run_command
from factory.toolchain import toolkit
from factory.toolchain.resolve import nvcc_version


@pytest.mark.download
def test_pypi_toolkit_layout(cuda13_home: Path) -> None:
    for rel in (
        "bin/nvcc",
        "bin/ptxas",
        "bin/cudafe++",
        "bin/fatbinary",
        "nvvm/bin/cicc",
        "nvvm/libdevice/libdevice.10.bc",
        "include/cuda_runtime.h",
        "include/cuda_fp16.h",
        "include/crt/host_config.h",
        "include/nv/target",
        "include/cccl/cuda/std/version",
        "include/cublas_v2.h",
        "include/cusparse.h",
        "include/cusolverDn.h",
        "include/curand.h",
        "lib64/libcudart.so",
    ):
        assert (cuda13_home / rel).exists(), rel
    assert os.access(cuda13_home / "bin" / "nvcc", os.X_OK)
    assert os.access(cuda13_home / "nvvm" / "bin" / "cicc", os.X_OK)
    assert nvcc_version(cuda13_home / "bin" / "nvcc") == Version("13.0")


@pytest.mark.download
@pytest.mark.slow
def test_pypi_toolkit_compiles_for_sm100(cuda13_home: Path, tmp_path: Path) -> None:
    """A tiny kernel with cuda_fp16.h (which needs CCCL) compiles to an sm_100 object."""
    (tmp_path / "smoke.cu").write_text(
        "#include <cuda_fp16.h>\n#include <cuda_runtime.h>\n"
        "__global__ void smoke(__half* x) { x[threadIdx.x] = __hadd(x[threadIdx.x], x[0]); }\n"
        "int main() { return 0; }\n"
    )
    obj = tmp_path / "smoke.o"
    env = {**os.environ, "PATH": f"{cuda13_home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    run_command([cuda13_home / "bin" / "nvcc", "-gencode=arch=compute_100,code=sm_100", "-c",
                 tmp_path / "smoke.cu", "-o", obj], env=env, what="nvcc smoke compile")
    assert obj.is_file() and obj.stat().st_size > 0


@pytest.mark.download
def test_second_call_is_cached(
    cuda13_home: Path, example_cell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_download(*a: Any, **k: Any) -> None:
        raise AssertionError("a materialized toolkit must not be downloaded again")

    monkeypatch.setattr(toolkit, "download_wheels", no_download)
    assert toolkit.materialize_cuda_home(example_cell.toolchain, cuda13_home.parent) == cuda13_home
