"""The CPU platform axis (x86_64 default, aarch64) and cross builds, without compiling:
matrix validation, ids and keys, wheel tags, wheelhouses, the cross build's job file, the ELF
CPU check. The compile and the emulated import are in test_aarch64.py."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from conftest import FLASH_ATTN_MATRIX
from tag_fixtures import cell_from_wheel_filename
from wheel_fixtures import make_wheel

from factory.errors import ConfigError, WheelError
from factory.matrix.cell import Cell
from factory.matrix.load import PlannedCell, load_matrix
from factory.matrix.tags import (
    plat_for_platform,
    platform_of_plat,
    platform_tag_parts,
)
from factory.runners.base import BuildJob
from factory.runners.docker import DockerRunner
from factory.toolchain.cross import cross_image_name, inside_cross, target_runtime_requirement
from factory.toolchain.wheelhouse import platform_tags, wheelhouse_dir
from factory.wheels.finalize import analyse_wheel
from factory.wheels.binaries import check_cpu, elf_machine


def _matrix(extra: str = "") -> str:
    """conftest's one flash-attn cell, with ``extra`` after its [axes] (more axes, rules)."""
    return FLASH_ATTN_MATRIX.replace("\n[packages.", f"\n{extra}\n[packages.", 1)


def _cells(extra: str = "") -> dict[str, PlannedCell]:
    return {pc.cell.id: pc for pc in load_matrix(text=_matrix(extra)).cells}


def test_x86_64_cells_keep_their_ids_and_keys() -> None:
    """The axis is new: a matrix without it (or naming the default) plans exactly what it did."""
    (pc,) = _cells().values()
    assert pc.cell.id == "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311"
    (same,) = _cells('platform = ["x86_64"]').values()
    assert same.content_key == pc.content_key
    # the key written before the platform axis existed (main at the time of this change)
    assert Cell.from_id(pc.cell.id).content_key("1") == "687ebdd059fb61ff"


def test_aarch64_cells_have_their_own_id_key_and_tag_but_share_the_variant() -> None:
    cells = _cells('platform = ["x86_64", "arm64"]')
    x86 = cells["flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311"]
    arm = cells["flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311-aarch64"]
    assert arm.cell.platform == "aarch64" and x86.cell.platform == "x86_64"
    assert arm.content_key != x86.content_key
    assert arm.wheel.endswith("_aarch64.whl") and x86.wheel.endswith("_x86_64.whl")
    # same version and local tag: one per-variant URL serves both, pip picks by platform tag
    assert arm.wheel.rsplit("-", 1)[0] == x86.wheel.rsplit("-", 1)[0]
    assert arm.variant == x86.variant == "cu130-torch2.14-sm100"
    assert Cell.from_id(arm.cell.id) == arm.cell
    back = cell_from_wheel_filename(arm.wheel, (80, 90, 100, 120), torch="2.14.1")
    assert back.platform == "aarch64"


def test_platform_in_rules() -> None:
    only_arm = _cells('platform = ["x86_64", "aarch64"]\n[[exclude]]\nplatform = "x86_64"')
    assert list(only_arm) == ["flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311-aarch64"]
    text = _matrix() + (
        '[[include]]\npackage = "flash-attn"\ntorch = "2.14.1"\ncuda = "13.0"\narchs = ["10.0"]\n'
        'python = "3.11"\nplatform = "aarch64"\n'
    )
    ids = [pc.cell.id for pc in load_matrix(text=text).cells]
    assert ids == [
        "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311",
        "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311-aarch64",
    ]


@pytest.mark.parametrize("value", ['["riscv64"]', '["x86_64", "sparc"]', "[2]"])
def test_unknown_platform_is_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_matrix(text=_matrix(f"platform = {value}"))
    assert "\n" not in exc.value.message and "axes.platform" in exc.value.message


def test_plat_tags_per_cpu() -> None:
    assert plat_for_platform("manylinux_2_36_x86_64", "aarch64") == "manylinux_2_36_aarch64"
    assert plat_for_platform("manylinux2014_aarch64", "x86_64") == "manylinux2014_x86_64"
    assert platform_of_plat("manylinux_2_28_aarch64") == "aarch64"
    with pytest.raises(WheelError):
        platform_of_plat("win_amd64")
    with pytest.raises(WheelError):
        platform_of_plat("linux_riscv64")


@pytest.mark.parametrize(
    ("tag", "parts"),
    [
        ("manylinux_2_28_x86_64", ((2, 28), "x86_64")),
        ("manylinux2014_aarch64", ((2, 17), "aarch64")),
        ("manylinux1_x86_64", ((2, 5), "x86_64")),
        ("linux_aarch64", (None, "aarch64")),
        ("musllinux_1_2_x86_64", (None, "x86_64")),  # a musl floor is no glibc floor
        ("any", (None, "any")),
        ("win_amd64", (None, "win_amd64")),
    ],
)
def test_one_reading_of_a_platform_tag(tag: str, parts: tuple) -> None:
    assert platform_tag_parts(tag) == parts


def test_platform_tags_per_cpu() -> None:
    arm = platform_tags(28, "aarch64")
    assert arm[0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in arm
    assert not any("x86_64" in t or "manylinux1" in t for t in arm)
    assert platform_tags(28) == platform_tags(
        28, "x86_64"
    ) and "manylinux1_x86_64" in platform_tags(28)
    root = Path("/wh")
    assert wheelhouse_dir(root, "cp311") == root / "cp311"  # the layout from before the axis
    assert wheelhouse_dir(root, "cp311", "aarch64") == root / "cp311-aarch64"


def test_cross_image_and_runtime_names() -> None:
    assert (
        cross_image_name("factory-base:bookworm", "aarch64")
        == "factory-base:bookworm-cross-aarch64"
    )
    assert (
        cross_image_name("registry:5000/img", "aarch64") == "registry:5000/img:latest-cross-aarch64"
    )
    assert target_runtime_requirement("13.0") == "nvidia-cuda-runtime"
    assert target_runtime_requirement("12.8") == "nvidia-cuda-runtime-cu12"


def _job(tmp_path: Path, **cross: object) -> BuildJob:
    return BuildJob(
        cell_id="x-1-torch2.14.1-cu130-sm100-cp311-aarch64",
        python="3.11",
        src_dir=tmp_path / "src",
        out_dir=tmp_path / "out",
        wheelhouse=tmp_path / "wh" / "cp311",
        cuda_home=None,
        requirements=("torch==2.14.1",),
        log_path=tmp_path / "log" / "a.log",
        **cross,  # type: ignore[arg-type]
    )


def test_docker_job_of_a_cross_build(tmp_path: Path) -> None:
    """The target wheelhouse is mounted read-only; inside.py gets what to unpack and the cross
    compiler's environment; a native job has none of it."""
    target_wh = tmp_path / "wh" / "cp311-aarch64"
    job = _job(
        tmp_path,
        cross_target="aarch64",
        target_wheelhouse=target_wh,
        target_requirements=("torch==2.14.1", "nvidia-cuda-runtime"),
        target_pip_platforms=("manylinux_2_36_aarch64",),
    )
    runner = DockerRunner(client=object())
    vols = runner.volumes(job, tmp_path / "run")
    assert vols[str(target_wh.resolve())] == {"bind": "/factory/target-wheelhouse", "mode": "ro"}
    cross = runner.inside_job(job)["cross"]
    assert cross["target_dir"] == "/factory/venv/target-aarch64"
    assert cross["wheelhouse"] == "/factory/target-wheelhouse"
    assert cross["requirements"] == ["torch==2.14.1", "nvidia-cuda-runtime"]
    assert cross["env"]["CXX"] == "aarch64-linux-gnu-g++"
    assert cross["env"]["_PYTHON_HOST_PLATFORM"] == "linux-aarch64"
    assert cross["env"]["_PYTHON_SYSCONFIGDATA_NAME"] == "_sysconfigdata__aarch64-linux-gnu"
    assert cross["pip_args"][-2:] == ["--platform", "manylinux_2_36_aarch64"]
    assert "--no-deps" in cross["pip_args"]
    native = _job(tmp_path)
    assert runner.inside_job(native)["cross"] is None
    assert "/factory/target-wheelhouse" not in json.dumps(runner.volumes(native, tmp_path / "run"))


def test_inside_unpacks_the_target_and_points_the_compilers_at_it(tmp_path: Path) -> None:
    """The build script's cross step with a fake pip: the flags name the unpacked target's torch
    and CUDA runtime, and -lcudart gets its unversioned link."""
    from factory.runners.inside import cross as inside
    from factory.runners.inside.log import Log

    target = tmp_path / "target"
    calls: list[list[str]] = []

    def fake_run_step(argv: list[str], **_: object) -> int:
        calls.append(argv)
        (target / "torch" / "include").mkdir(parents=True)
        (target / "torch" / "lib").mkdir(parents=True)
        (target / "nvidia" / "cu13" / "lib").mkdir(parents=True)
        (target / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_bytes(b"")
        return 0

    cross = inside_cross(
        target="aarch64",
        python="3.11",
        target_dir=str(target),
        wheelhouse="/wh",
        requirements=("torch==2.14.1",),
        pip_platforms=["manylinux_2_28_aarch64"],
    )
    log = Log(str(tmp_path / "log"))
    orig = inside.run_step
    inside.run_step = fake_run_step  # type: ignore[assignment]
    try:
        code, env = inside.prepare_target(cross, "python3", log, {})
        again, _ = inside.prepare_target(cross, "python3", log, {})  # stamped: no second install
    finally:
        inside.run_step = orig  # type: ignore[assignment]
    assert code == again == 0 and len(calls) == 1
    assert calls[0][:4] == ["python3", "-m", "pip", "install"] and "--target" in calls[0]
    assert env["CXXFLAGS"].split()[0] == f"-I{target}/torch/include"
    assert env["NVCC_PREPEND_FLAGS"] == env["CFLAGS"] == env["CXXFLAGS"]
    assert env["LDFLAGS"] == f"-L{target}/torch/lib -L{target}/nvidia/cu13/lib"
    assert (target / "nvidia" / "cu13" / "lib" / "libcudart.so").resolve().name == "libcudart.so.13"
    assert env["CC"] == "aarch64-linux-gnu-gcc"
    if "PYTHONPATH" in env:  # a build Python without the target's sysconfig data gets one made
        made = Path(env["PYTHONPATH"]) / "_sysconfigdata__aarch64-linux-gnu.py"
        assert "'EXT_SUFFIX': '.cpython-3" in made.read_text()
        assert (
            "aarch64-linux-gnu.so'" in made.read_text()
            and "x86_64-linux-gnu" not in made.read_text()
        )


@pytest.mark.parametrize("found_by", ["job", "CUDA_HOME", "nvcc on PATH"])
def test_inside_names_the_cccl_headers_of_the_toolkit_torch_will_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found_by: str
) -> None:
    """CUDA 13's thrust/cub live in include/cccl; a cross build names that folder of the toolkit
    torch's build finds (the job's, CUDA_HOME, the nvcc on PATH), not a guessed /usr/local/cuda."""
    from factory.runners.inside import cross as inside
    from factory.runners.inside.log import Log

    kit = tmp_path / "kit"
    (kit / "include" / "cccl").mkdir(parents=True)
    (kit / "bin").mkdir()
    (kit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (kit / "bin" / "nvcc").chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if found_by == "CUDA_HOME":
        monkeypatch.setenv("CUDA_HOME", str(kit))
    elif found_by == "nvcc on PATH":
        monkeypatch.setenv("PATH", f"{kit / 'bin'}:/usr/bin:/bin")
    target = tmp_path / "target"

    def fake_run_step(argv: list[str], **_: object) -> int:
        for d in ("torch/include", "torch/lib"):
            (target / d).mkdir(parents=True)
        return 0

    cross = inside_cross(
        target="aarch64", python="3.11", target_dir=str(target), wheelhouse="/wh",
        requirements=("torch==2.14.1",), pip_platforms=["manylinux_2_28_aarch64"],
    )
    monkeypatch.setattr(inside, "run_step", fake_run_step)
    code, env = inside.prepare_target(
        cross, "python3", Log(str(tmp_path / "log")), {},
        cuda_home=str(kit) if found_by == "job" else None,
    )
    assert code == 0 and f"-I{kit}/include/cccl" in env["CXXFLAGS"].split()


def _elf(machine: int) -> bytes:
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[18:20] = machine.to_bytes(2, "little")
    return bytes(header)


@pytest.mark.parametrize(
    ("plat", "machines", "ok", "detail"),
    [
        ("manylinux_2_36_aarch64", [183, 183], True, "2 ELF file(s), all AArch64"),
        ("manylinux_2_36_x86_64", [62], True, "1 ELF file(s), all X86-64"),
        ("manylinux_2_36_aarch64", [183, 62], False, "wanted AArch64: pkg/b.so is X86-64"),
        ("manylinux_2_36_x86_64", [183], False, "wanted X86-64: pkg/a.so is AArch64"),
    ],
)
def test_cpu_check(tmp_path: Path, plat: str, machines: list[int], ok: bool, detail: str) -> None:
    members = {f"pkg/{name}.so": _elf(m) for name, m in zip("ab", machines, strict=False)}
    wheel = make_wheel(
        tmp_path, name="pkg", version="1.0+cu130torch2.14", tag=f"cp311-cp311-{plat}", files=members
    )
    check = check_cpu(analyse_wheel(wheel))
    assert (check.ok, check.detail) == (ok, detail)
    assert elf_machine(b"not an elf file at all") is None
    with zipfile.ZipFile(wheel) as zf:
        assert sum(elf_machine(zf.read(n)[:20]) is not None for n in zf.namelist()) == len(machines)


def test_local_job_of_a_cross_build(tmp_path: Path) -> None:
    """The local runner (a GPU box without docker) cross-builds with the same job file: host
    paths, the target next to the build tree when the interpreter is used as it is."""
    from factory.runners.local import LocalRunner

    target_wh = tmp_path / "wh" / "cp311-aarch64"
    job = _job(
        tmp_path,
        cross_target="aarch64",
        target_wheelhouse=target_wh,
        target_requirements=("torch==2.14.1",),
        target_pip_platforms=("manylinux_2_39_aarch64",),
    )
    existing = LocalRunner(mode="existing", interpreter="python3").inside_job(
        job, report=tmp_path / "r.json", capped=False
    )
    assert existing["cross"]["target_dir"] == f"{tmp_path.resolve()}/target-aarch64"
    assert existing["cross"]["wheelhouse"] == str(target_wh.resolve())
    venv = LocalRunner(mode="venv").inside_job(job, report=tmp_path / "r.json", capped=False)
    assert venv["cross"]["target_dir"] == f"{venv['venv']}/target-aarch64"
