"""A CUDA_HOME for a toolchain: made from NVIDIA's PyPI component wheels, a system path, or
nothing (the builder image carries its own).

The CUDA 13 component wheels all unpack into ``nvidia/cu13/``; merged, they are a toolkit
torch's extension builder accepts: ``bin/nvcc`` (+ ``nvcc.profile``, which finds ``nvvm/bin/cicc``
and adds ``include/cccl``), ``include`` (runtime, crt, CCCL's ``<nv/target>`` that
``cuda_fp16.h`` needs), and ``lib64`` (torch links ``-L$CUDA_HOME/lib64 -lcudart``; the wheels
ship ``lib/libcudart.so.13`` only, so the unversioned link is added).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import zipfile
from pathlib import Path

from factory.errors import ToolchainError
from factory.toolchain.cross import builder_platform
from factory.toolchain.resolve import Toolchain, nvcc_version
from factory.toolchain.wheelhouse import download_wheels

# Headers torch's own CUDA headers include (ATen/cuda/CUDAContext.h: cublas_v2.h, cusparse.h,
# cusolverDn.h; curand for ATen's random kernels). flash-attn includes CUDAContext.h, so a
# toolkit without them cannot build it. Only their include/ is unpacked: the libraries are
# hundreds of MB and come with torch at run time.
HEADER_EXTRAS = ("cublas", "cusparse", "cusolver", "curand")
STAMP = ".factory-toolkit"


def materialize_cuda_home(toolchain: Toolchain, cache_dir: Path) -> Path | None:
    """The CUDA_HOME to mount or export for ``toolchain``; None when the build image has one.

    For the 'pypi' source the merged toolkit is cached as ``cache_dir/cuda-<X.Y>``; a second
    call returns at once. Raises ToolchainError when nvcc's version is not the cell's.
    """
    if toolchain.nvcc_source == "image":
        return None
    if toolchain.nvcc_source == "system":
        if not toolchain.system_path:
            raise ToolchainError("the system toolchain has no path")
        home = Path(toolchain.system_path)
        _check_version(home, toolchain.cuda)
        return home
    if toolchain.nvcc_source != "pypi":
        raise ToolchainError(f"unknown nvcc source {toolchain.nvcc_source!r}")
    home = cache_dir / f"cuda-{toolchain.cuda}"
    if (home / STAMP).is_file() and (home / "bin" / "nvcc").is_file():
        return home
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".toolkit-", dir=cache_dir) as tmp:
        downloads = Path(tmp) / "wheels"
        # the toolkit runs on the builder: its CPU's wheels (for every cell's platform; device
        # code does not depend on the host CPU, and a cross build's host compiler is separate)
        builder = builder_platform()
        maj, mnr = toolchain.cuda.split(".")
        # The cuda-toolkit metapackage pins the library versions that belong to this CUDA.
        headers_req = f"cuda-toolkit[{','.join(HEADER_EXTRAS)}]>={maj}.{mnr},<{maj}.{int(mnr) + 1}"
        # The toolkit runs on the host or in the build image: any glibc >= 2.17 image will do.
        download_wheels(
            list(toolchain.nvcc_requirements),
            downloads,
            python=f"{sys.version_info[0]}.{sys.version_info[1]}",
            glibc_minor=28,
            platform=builder,
            no_deps=True,
            log_path=cache_dir / f"cuda-{toolchain.cuda}.download.log",
        )
        full_wheels = set(downloads.glob("*.whl"))
        download_wheels(
            [headers_req],
            downloads,
            python=f"{sys.version_info[0]}.{sys.version_info[1]}",
            glibc_minor=28,
            platform=builder,
            log_path=cache_dir / f"cuda-{toolchain.cuda}.download.log",
        )
        staging = Path(tmp) / "home"
        for wheel in sorted(downloads.glob("*.whl")):
            _unpack_component(wheel, staging, headers_only=wheel not in full_wheels)
        _finish_layout(staging)
        _check_version(staging, toolchain.cuda)
        (staging / STAMP).write_text(
            "\n".join(sorted(w.name for w in downloads.glob("*.whl"))) + "\n"
        )
        if home.exists():  # a stale, unstamped attempt
            shutil.rmtree(home)
        os.replace(staging, home)
    return home


def _unpack_component(wheel: Path, home: Path, *, headers_only: bool) -> None:
    """Unpack ``nvidia/cu<N>/...`` (or 12.x's ``nvidia/<component>/...``) of one wheel into home,
    keeping the executable bits that ``zipfile.extractall`` drops."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if len(parts) < 4 or parts[0] != "nvidia" or info.is_dir():
                continue
            rel = Path(*parts[2:])
            if headers_only and parts[2] != "include":
                continue
            if rel.parts[0] == ".metadata" or (
                len(rel.parts) > 1 and rel.parts[1] == "__pycache__"
            ):
                continue
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o111 or rel.parts[0] == "bin" or rel.parts[:2] == ("nvvm", "bin"):
                target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _finish_layout(home: Path) -> None:
    lib = home / "lib"
    if not (home / "bin" / "nvcc").is_file():
        raise ToolchainError("the CUDA component wheels held no bin/nvcc")
    if lib.is_dir() and not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    for versioned in sorted(lib.glob("libcudart.so.*")):
        link = lib / "libcudart.so"
        if not link.exists():
            link.symlink_to(versioned.name)
        break


def _check_version(home: Path, cuda: str) -> None:
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        raise ToolchainError(f"{nvcc} does not exist")
    got = nvcc_version(nvcc)
    if f"{got.major}.{got.minor}" != cuda:
        raise ToolchainError(
            f"nvcc in {home} is CUDA {got.major}.{got.minor}, the cell needs {cuda}",
            tip="torch's extension builder needs the toolkit of torch.version.cuda",
        )
