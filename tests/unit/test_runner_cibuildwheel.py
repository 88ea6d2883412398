"""The cibuildwheel runner: its configuration and cibuildwheel's own reading of it (the real
build: tests/integration/test_runner_cibuildwheel.py)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path

import pytest
from tools import tool

from factory.errors import UsageError
from factory.process import run_command
from factory.runners import BuildJob, get_runner
from factory.runners.cibuildwheel import (
    CibuildwheelRunner,
    cibuildwheel_environment,
    cibuildwheel_image,
    wrapped_toolkit,
)

REPO = Path(__file__).resolve().parents[2]


def _job(tmp: Path, *, cache: Path | None = None) -> BuildJob:
    return BuildJob(
        cell_id="flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp312",
        python="3.12",
        src_dir=REPO / "tests" / "example_ext",
        out_dir=tmp / "out",
        wheelhouse=tmp / "wh",
        cuda_home=tmp / "cuda",
        requirements=("torch==2.14.1", "setuptools", "ninja"),
        env={"FLASH_ATTN_CUDA_ARCHS": "100", "MAX_JOBS": "4", "NVCC_THREADS": "1"},
        memory_limit_bytes=16 << 30,
        cpus=4,
        pids_limit=4096,
        log_path=tmp / "build.log",
        cache_dir=cache,
    )


def test_configuration_carries_caps_offline_install_and_excludes(tmp_path: Path) -> None:
    env = cibuildwheel_environment(_job(tmp_path))
    assert env["CIBW_BUILD"] == "cp312-manylinux_x86_64"
    engine = env["CIBW_CONTAINER_ENGINE"]
    assert engine.startswith("docker; create_args: ")
    args = shlex.split(engine.split("create_args:", 1)[1])
    assert {
        "--memory=16384m",
        "--memory-swap=16384m",
        "--cpus=4",
        "--network=none",
        "--pids-limit=4096",
    } <= set(args)
    assert f"--volume={(tmp_path / 'wh').resolve()}:/factory/wheelhouse:ro" in args
    assert (
        "pip install --no-index --find-links /factory/wheelhouse torch==2.14.1"
        in env["CIBW_BEFORE_BUILD"]
    )
    assert env["CIBW_BUILD_FRONTEND"] == "build; args: --no-isolation"  # pypa/build
    assert "FLASH_ATTN_CUDA_ARCHS=100" in env["CIBW_ENVIRONMENT"]
    assert "CUDA_HOME=/factory/cuda" in env["CIBW_ENVIRONMENT"]
    assert "TORCH_NO_COMPILER_WRAPPER=1" in env["CIBW_ENVIRONMENT"]
    # the factory repairs on the host, as for every runner (excludes, tag, pin, glibc floor)
    assert env["CIBW_REPAIR_WHEEL_COMMAND_LINUX"] == ""


def test_the_compiler_wrappers_reach_the_cibuildwheel_container(tmp_path: Path) -> None:
    """The build's toolkit is made on the host with links into the toolkit as the container
    mounts it, and nvcc and C++ go through the factory's wrappers there too."""
    job = dataclasses.replace(_job(tmp_path), src_dir=tmp_path / "work" / "src",
                              compilers={"archs": [100], "cxx_std": 20, "package_archs": []},
                              check_build_requires=False)
    real = tmp_path / "cuda"
    (real / "bin").mkdir(parents=True)
    (real / "include").mkdir()
    (real / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (real / "bin" / "ptxas").write_text("#!/bin/sh\n")
    home = wrapped_toolkit(job)
    assert home == tmp_path / "work" / "toolkit-cibuildwheel"
    assert os.readlink(home / "include") == "/factory/cuda/include"
    assert os.readlink(home / "bin" / "ptxas") == "/factory/cuda/bin/ptxas"
    assert (home / "bin" / "nvcc").read_text().startswith("#!/opt/python/cp312-cp312/bin/python")
    env = cibuildwheel_environment(job)
    args = shlex.split(env["CIBW_CONTAINER_ENGINE"].split("create_args:", 1)[1])
    assert f"--volume={home}:/factory/toolkit:ro" in args
    inner = env["CIBW_ENVIRONMENT"]
    assert "CUDA_HOME=/factory/toolkit" in inner and "FACTORY_CELL_ARCHS=100" in inner
    assert "FACTORY_NVCC_NEXT=/factory/cuda/bin/nvcc" in inner
    assert "CXX=/factory/toolkit/bin/factory-c++" in inner and "FACTORY_CXX_STD=20" in inner
    assert env["CIBW_BUILD_FRONTEND"].endswith("--skip-dependency-check")


def test_a_factory_image_is_run_through_its_cibuildwheel_twin(tmp_path: Path) -> None:
    assert cibuildwheel_image("factory-base:bookworm") == "factory-base:bookworm-cibw"
    official = "quay.io/pypa/manylinux_2_28_x86_64"
    assert cibuildwheel_image(official) == official
    job = dataclasses.replace(_job(tmp_path), image="factory-base:bookworm",
                              sysroot=tmp_path / "sysroot")
    env = cibuildwheel_environment(job)
    assert env["CIBW_MANYLINUX_X86_64_IMAGE"] == "factory-base:bookworm-cibw"
    assert f"--volume={(tmp_path / 'sysroot').resolve()}:/factory/sysroot:ro" in env[
        "CIBW_CONTAINER_ENGINE"]
    assert "CXX=/factory/sysroot/bin/g++" in env["CIBW_ENVIRONMENT"]


def test_cache_is_mounted_and_nvcc_wrapped(tmp_path: Path) -> None:
    env = cibuildwheel_environment(_job(tmp_path, cache=tmp_path / "cc"))
    assert ":/factory/cache:rw" in env["CIBW_CONTAINER_ENGINE"]
    assert "PYTORCH_NVCC='sccache /factory/cuda/bin/nvcc'" in env["CIBW_ENVIRONMENT"]


def test_cibuildwheel_reads_the_configuration(tmp_path: Path) -> None:
    tool("cibuildwheel")
    runner = get_runner("cibuildwheel")
    assert isinstance(runner, CibuildwheelRunner)
    job = _job(tmp_path)
    result = run_command(
        ["cibuildwheel", "--platform", "linux", "--print-build-identifiers", str(job.src_dir)],
        env=cibuildwheel_environment(job, base=os.environ),
        what="cibuildwheel --print-build-identifiers",
    )
    found = [ln.strip() for ln in result.output.splitlines()
             if re.fullmatch(r"[a-z0-9]+-\w+", ln.strip())]
    assert found == ["cp312-manylinux_x86_64"]


def test_unknown_runner_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="known: docker, local, cibuildwheel"):
        get_runner("podman")



@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_native_builds_follow_the_builders_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine: str
) -> None:
    """On a Grace (aarch64) builder cibuildwheel builds aarch64 in its aarch64 image; a cross job
    (an aarch64 cell on an x86_64 builder) is refused in one line, not built for the wrong CPU."""
    import factory.runners.cibuildwheel as cibw
    from factory.errors import EngineError

    monkeypatch.setattr(cibw, "builder_platform", lambda: machine)
    env = cibuildwheel_environment(dataclasses.replace(_job(tmp_path), image=None))
    assert env["CIBW_BUILD"] == f"cp312-manylinux_{machine}"
    assert env["CIBW_ARCHS_LINUX"] == machine
    assert env[f"CIBW_MANYLINUX_{machine.upper()}_IMAGE"] == cibuildwheel_image(
        f"quay.io/pypa/manylinux_2_28_{machine}"
    )
    other = "aarch64" if machine == "x86_64" else "x86_64"
    refused = f"only for this builder's CPU \\({machine}\\), not {other}"
    with pytest.raises(EngineError, match=refused):
        cibuildwheel_environment(dataclasses.replace(_job(tmp_path), cross_target=other))
