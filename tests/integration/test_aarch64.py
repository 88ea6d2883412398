"""The bundled example cell for aarch64 (GB200/GH200 hosts), cross-built on this x86_64 machine
in the network-less container, next to its x86_64 cell, through the real CLI:

* the x86_64 cell is the session's default build of the example (conftest.example_build),
  published here beside the aarch64 cell, which builds with the compile cache on; its verify
  passes: every ELF is AArch64, SASS sm_100 only, and the wheel installs for aarch64 and imports
  with aarch64 torch under qemu-user;
* the two wheels carry byte-identical cubins (device code does not depend on the host CPU);
* from the served index, one per-variant URL gives pip on this host the x86_64 wheel and Debian
  12's own pip (23.0.1) in an arm64 container (qemu-user through binfmt_misc) the aarch64 one,
  which loads there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, ExampleBuild, cache_root

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CELL = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
ARM_IMAGE = "factory-test-arm64:bookworm"
SYSROOTS = cache_root() / "aarch64-test" / "sysroots"  # where the build's verify keeps them


def _factory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "factory", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "CI": "true"},
        cwd=REPO,
        timeout=3000,
    )


def _binfmt_aarch64() -> bool:
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    return entry.is_file() and entry.read_text().startswith("enabled")


@pytest.fixture(scope="module")
def qemu() -> str:
    from factory.toolchain.cross import find_qemu

    found = find_qemu("aarch64")
    if found is None or not _binfmt_aarch64():
        pytest.skip("needs qemu-user-static with binfmt_misc (docker/setup-host.sh installs both)")
    return found


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory,
    example_build: ExampleBuild,
    qemu: str,
) -> Iterator[tuple[Path, Path, str]]:
    tmp = tmp_path_factory.mktemp("aarch64")
    work = cache_root() / "aarch64-test"
    for fresh in ("work", "compile-cache"):  # a fresh build tree and cache every run
        shutil.rmtree(work / fresh, ignore_errors=True)
    matrix = tmp / "matrix.toml"
    matrix.write_text(f"""\
version = 1
[settings]
store = "{tmp / "store"}"
wheelhouse = "{cache_root() / "wheelhouse"}"
work-dir = "{work / "work"}"
venv-dir = "{cache_root() / "venvs"}"
compile-cache = {{ dir = "{work / "compile-cache"}" }}
[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [["10.0"]]
python = ["3.11"]
platform = ["x86_64", "aarch64"]
[packages.factory-example-ext]
recipe = "torch-extension"
versions = ["0.1.0"]
source = "{REPO / "tests" / "example_ext"}"
""")
    # the x86_64 cell: the session's default build, published to this test's store too
    (tmp / "dist").mkdir()
    for made in (example_build.wheel,
                 example_build.wheel.with_name(example_build.wheel.name + ".provenance.json")):
        shutil.copy2(made, tmp / "dist" / made.name)
    x86 = _factory("publish", "--store", str(tmp / "store"), str(tmp / "dist" /
                                                                  example_build.wheel.name))
    assert x86.returncode == 0, x86.stdout[-3000:] + x86.stderr[-3000:]
    arm = _factory(
        "build",
        f"{CELL}-aarch64",
        "--matrix",
        str(matrix),
        "--cache",
        "--publish",
        "--out",
        str(tmp / "dist"),
    )
    assert arm.returncode == 0, arm.stdout[-3000:] + arm.stderr[-3000:]
    yield tmp, tmp / "store", arm.stdout + arm.stderr


def test_the_cross_built_wheel_passes_verify(built: tuple[Path, Path, str]) -> None:
    tmp, _, output = built
    (wheel,) = (tmp / "dist").glob("*_aarch64.whl")
    assert re.fullmatch(
        r"factory_example_ext-0\.1\.0\+cu130torch2\.14sm100-cp311-cp311-manylinux_2_\d+_aarch64\.whl",
        wheel.name,
    )
    assert re.search(r"pass cpu: 1 ELF file\(s\), all AArch64", output), output[-3000:]
    assert "pass archs: SASS sm_100 in 1 file(s), no PTX" in output
    assert re.search(r"pass import: installed for aarch64 .* under qemu-aarch64", output)
    manifest = json.loads(wheel.with_name(wheel.name + ".provenance.json").read_text())
    assert manifest["cell"]["platform"] == "aarch64"
    assert manifest["builder"]["image"].endswith("-cross-aarch64")
    with zipfile.ZipFile(wheel) as zf:
        assert "factory_example_ext/_C.cpython-311-aarch64-linux-gnu.so" in zf.namelist()


def _cubins(wheel: Path, tmp: Path) -> dict[str, bytes]:
    from factory.wheels.binaries import find_cuobjdump

    out = tmp / wheel.name
    out.mkdir()
    with zipfile.ZipFile(wheel) as zf:
        (member,) = [n for n in zf.namelist() if n.endswith(".so")]
        (out / "lib.so").write_bytes(zf.read(member))
    subprocess.run(
        [str(find_cuobjdump()), "-xelf", "all", "lib.so"], cwd=out, check=True, capture_output=True
    )
    # cuobjdump names extracts <lib>.<n>.sm_100.cubin: the order of the fatbin, not the CPU
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.cubin"))}


def test_cubins_are_identical_to_the_x86_64_cells(
    built: tuple[Path, Path, str], tmp_path: Path
) -> None:
    tmp, _, _ = built
    (x86,) = (tmp / "dist").glob("*_x86_64.whl")
    (arm,) = (tmp / "dist").glob("*_aarch64.whl")
    x86_cubins, arm_cubins = _cubins(x86, tmp_path), _cubins(arm, tmp_path)
    assert len(x86_cubins) == 4 and all(".sm_100.cubin" in n for n in x86_cubins)
    assert arm_cubins == x86_cubins


@pytest.fixture(scope="module")
def arm_image(built: tuple[Path, Path, str], docker_engine: object) -> str:
    """An arm64 Debian image made from the verify's sysroot (docker import, no registry)."""
    from factory.toolchain.cross import ensure_target_sysroot

    sysroot = ensure_target_sysroot(SYSROOTS, target="aarch64", python="3.11")
    have = subprocess.run(["docker", "image", "inspect", ARM_IMAGE], capture_output=True)
    if have.returncode != 0:
        tarball = built[0] / "sysroot.tar"
        with tarfile.open(tarball, "w") as tf:
            tf.add(sysroot, arcname=".")
        subprocess.run(
            ["docker", "import", "--platform", "linux/arm64", str(tarball), ARM_IMAGE],
            check=True,
            capture_output=True,
        )
        tarball.unlink()
    return ARM_IMAGE


@pytest.fixture(scope="module")
def arm_torch(built: tuple[Path, Path, str]) -> Path:
    """aarch64 torch 2.14.1 and its deps unpacked once (host pip, the target's tags), kept in
    the test cache: the arm64 container imports it read-only."""
    from factory.toolchain.cross import pip_for_platform
    from factory.toolchain.wheelhouse import platform_tags

    site = cache_root() / "targets" / "cp311-aarch64-torch2.14.1"
    if not (site / ".complete").is_file():
        shutil.rmtree(site, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links",
             str(cache_root() / "wheelhouse" / "cp311-aarch64"), "--target", str(site),
             *pip_for_platform("3.11", platform_tags(36, "aarch64")), "torch==2.14.1"],
            check=True, capture_output=True,
        )
        (site / ".complete").write_text("")
    return site


def test_one_url_serves_each_cpu_its_wheel_and_it_loads_on_arm64(
    built: tuple[Path, Path, str], arm_image: str, arm_torch: Path, tmp_path: Path
) -> None:
    from factory.toolchain.cross import ensure_target_sysroot

    tmp, store, _ = built
    sysroot = ensure_target_sysroot(SYSROOTS, target="aarch64", python="3.11")
    server = subprocess.Popen(
        [sys.executable, "-m", "factory", "serve", "--store", str(store), "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        m = re.search(r"(http://127\.0\.0\.1:\d+)/simple/", server.stdout.readline())
        assert m
        url = f"{m.group(1)}/cu130-torch2.14-sm100/simple/"
        host = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-cache-dir",
                "--index-url",
                url,
                "-d",
                str(tmp_path / "x86"),
                "factory-example-ext",
            ],
            capture_output=True,
            text=True,
        )
        assert host.returncode == 0, host.stdout + host.stderr
        assert [p.name.rsplit("-", 1)[1] for p in (tmp_path / "x86").iterdir()] == [
            f"{(next((tmp / 'dist').glob('*_x86_64.whl'))).name.rsplit('-', 1)[1]}"
        ]
        script = (
            "set -e; uname -m; "
            f"python3.11 -m pip install -q --no-deps --no-cache-dir --break-system-packages "
            f"--target /ext --index-url {url} factory-example-ext; ls /ext; "
            "python3.11 -I -c \"import sys; sys.path[:0] = ['/ext', '/torch']; "
            "import torch, factory_example_ext as e; "
            "print('loaded', e.add.default._schema, torch.__version__)\""
        )
        run = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "host",
                # qemu-user shows the host's CPU files; torch's CPU probing needs aarch64 ones
                "-v",
                f"{sysroot}/proc/cpuinfo:/proc/cpuinfo:ro",
                "-v",
                f"{sysroot}/sys/devices/system/cpu:/sys/devices/system/cpu:ro",
                "-v",
                f"{arm_torch}:/torch:ro",
                arm_image,
                "bash",
                "-c",
                script,
            ],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert run.stdout.splitlines()[0] == "aarch64"
        assert "factory_example_ext-0.1.0+cu130torch2.14sm100.dist-info" in run.stdout
        assert re.search(
            r"loaded factory_example_ext::add\(Tensor \w+, Tensor \w+\) -> Tensor "
            r"2\.14\.1\+cu130",
            run.stdout,
        ), run.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
