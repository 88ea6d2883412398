"""Cross builds: a cell for another CPU than the builder's (aarch64 wheels on x86_64 builders).

Device code (cicc, ptxas: the expensive part) does not depend on the host CPU, so the builder's
own nvcc compiles it at full speed; only the host-side C++ needs the target's compiler, headers
and libraries. What a cross build changes, and nothing else:

* the builder image: ``<base>-cross-<platform>``, the base plus the target's cross compiler and
  the target's Python headers (Debian multiarch: ``crossbuild-essential-arm64``,
  ``libpython3.X-dev:arm64``), made from the base by the factory itself;
* the target's torch and CUDA runtime, unpacked from the target wheelhouse into the build venv
  (``pip install --target --platform``, no emulation) and put before the builder's own torch:
  ``-I`` through CFLAGS/CXXFLAGS and NVCC_PREPEND_FLAGS (the headers differ: ATen/Config.h),
  ``-L`` through LDFLAGS. The builder's torch still runs setup.py and torch's extension builder;
* CPython's own cross-build variables: ``_PYTHON_HOST_PLATFORM`` (setuptools tags the wheel
  ``linux_aarch64``) and ``_PYTHON_SYSCONFIGDATA_NAME`` (the target's EXT_SUFFIX, compilers and
  flags), with CC/CXX the cross compiler (torch hands CC to nvcc as ``-ccbin``).

A native build (an aarch64 cell on an aarch64 builder) uses none of this: the same code paths
as x86_64, with the builder's own wheels.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform as _platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from factory.engine import docker_client
from factory.errors import EngineError
from factory.matrix.cell import DEFAULT_PLATFORM, PLATFORMS, Cell, parse_platform
from factory.toolchain.images import DEBIAN_MIRROR, debootstrap_foreign, image_progress
from factory.toolchain.python_image import SUITE_PYTHONS


@dataclasses.dataclass(frozen=True, kw_only=True)
class CpuPlatform:
    name: str  # "aarch64": wheel tags and `uname -m`
    triplet: str  # GNU triplet: the cross compiler's prefix and the multiarch directory
    debian_arch: str  # dpkg's name: "arm64"
    elf_machine: int  # e_machine in the ELF header
    elf_name: str  # as readelf prints it
    cuda_redist: str  # NVIDIA's redist archives for toolkits that run on it: "linux-sbsa"


CPU_PLATFORMS = {
    "x86_64": CpuPlatform(
        name="x86_64",
        triplet="x86_64-linux-gnu",
        debian_arch="amd64",
        elf_machine=62,
        elf_name="X86-64",
        cuda_redist="linux-x86_64",
    ),
    "aarch64": CpuPlatform(
        name="aarch64",
        triplet="aarch64-linux-gnu",
        debian_arch="arm64",
        elf_machine=183,
        elf_name="AArch64",
        cuda_redist="linux-sbsa",  # Arm servers, Grace too
    ),
}
assert set(CPU_PLATFORMS) == set(PLATFORMS)

_log = logging.getLogger(__name__)

# Labels of a cross image: what it was made from, so a changed base or package set remakes it.
CROSS_BASE_LABEL = "org.factory.cross-base"
CROSS_PACKAGES_LABEL = "org.factory.cross-packages"


def builder_platform() -> str:
    """The CPU this builder runs (and its docker engine's containers run natively)."""
    return parse_platform(_platform.machine() or DEFAULT_PLATFORM)


def is_cross(cell: Cell, builder: str | None = None) -> bool:
    return cell.platform != (builder or builder_platform())


# (builder, target) pairs the factory cross-builds; every CPU builds its own cells natively.
CROSS_BUILDS = {("x86_64", "aarch64")}


def can_build(*, builder: str, target: str) -> bool:
    """Whether a builder of CPU ``builder`` builds cells for ``target``."""
    return target == builder or (builder, target) in CROSS_BUILDS


def cross_image_name(base: str, target: str) -> str:
    """'factory-base:bookworm' -> 'factory-base:bookworm-cross-aarch64'."""
    last = base.rsplit("/", 1)[-1]
    repo, tag = base.rsplit(":", 1) if ":" in last else (base, "latest")
    return f"{repo}:{tag}-cross-{target}"


def base_of_cross_image(name: str, target: str) -> str:
    """The inverse of ``cross_image_name``."""
    suffix = f"-cross-{target}"
    if not name.endswith(suffix):
        return name
    base = name.removesuffix(suffix)
    return base.removesuffix(":latest") if ":latest" in base else base


def cross_packages(python: str, target: str) -> tuple[str, ...]:
    arch = CPU_PLATFORMS[target].debian_arch
    return (f"crossbuild-essential-{arch}", f"libpython{python}-dev:{arch}")


def _packages_label(python: str, target: str) -> str:
    return ",".join(cross_packages(python, target))


def ensure_cross_image(base: str, *, target: str, python: str, client: Any | None = None) -> str:
    """The cross builder image for ``base`` (made once: a container from ``base`` with the
    network on installs the packages, then is committed). Returns its name."""
    # heavy: the docker SDK, imported when used
    from docker.errors import APIError, ImageNotFound

    client = client or docker_client()
    name = cross_image_name(base, target)
    want = {
        CROSS_BASE_LABEL: _image_id(client, base),
        CROSS_PACKAGES_LABEL: _packages_label(python, target),
    }
    try:
        labels = (client.images.get(name).attrs.get("Config") or {}).get("Labels") or {}
        if all(labels.get(k) == v for k, v in want.items()):
            return name
    except ImageNotFound:
        pass
    arch = CPU_PLATFORMS[target].debian_arch
    script = (
        f"set -e; dpkg --add-architecture {arch}; apt-get update -qq; "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        f"{' '.join(cross_packages(python, target))} >/dev/null; "
        "rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb"
    )
    _log.info(f"+ making {name} from {base}: {script}")
    start = time.monotonic()
    try:
        container = client.containers.run(base, ["bash", "-c", script], detach=True, user="0")
    except APIError as exc:
        raise EngineError(f"cannot start {base} to make {name}: {exc.explanation or exc}") from None
    try:
        with image_progress(f"making {name}", container):
            status = container.wait()
        if int(status.get("StatusCode", 1)) != 0:
            tail = container.logs().decode(errors="replace").strip().splitlines()[-1:]
            raise EngineError(
                f"making {name} failed: {(tail or ['no output'])[0][:300]}",
                tip="the builder needs a Debian mirror while it makes the cross image (once)",
            )
        repo, tag = name.rsplit(":", 1)
        changes = [f"LABEL {k}={v}" for k, v in want.items()]
        container.commit(repository=repo, tag=tag, changes=changes)
    finally:
        container.remove(force=True)
    _log.info(f"  made in {time.monotonic() - start:.0f} s")
    return name


def _image_id(client: Any, image: str) -> str:
    # heavy: the docker SDK, imported when used
    from docker.errors import ImageNotFound

    try:
        return str(client.images.get(image).id)
    except ImageNotFound:
        raise EngineError(
            f"builder image {image} does not exist", tip="make it with 'factory image base'"
        ) from None


def target_runtime_requirement(cuda: str) -> str:
    """The CUDA runtime wheel that holds libcudart for the target (the extension links it)."""
    major = int(cuda.split(".")[0])
    return "nvidia-cuda-runtime" if major >= 13 else f"nvidia-cuda-runtime-cu{major}"


def pip_for_platform(python: str, platforms: list[str]) -> list[str]:
    """``pip install --target`` options that install for another interpreter and CPU than pip's
    own: binary wheels whose tags fit CPython ``python`` on ``platforms`` (pip matches each
    --platform tag exactly, factory.toolchain.wheelhouse.platform_tags lists them)."""
    cp = "cp" + python.replace(".", "")
    return [
        "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
        "--abi", cp, "--abi", "abi3", "--abi", "none",
        *[a for p in platforms for a in ("--platform", p)],
    ]


def inside_cross(
    *,
    target: str,
    python: str,
    target_dir: str,
    wheelhouse: str,
    requirements: tuple[str, ...],
    pip_platforms: list[str],
    compilers: bool = True,
) -> dict[str, Any]:
    """The job file's ``cross`` section (inside.py): what to unpack where, and the build's
    environment. Include and library flags are added by inside.py, which knows where the
    unpacked files are. ``compilers``: set CC/CXX to the cross compiler (False: the job's
    environment names them already, the target glibc sysroot's wrappers)."""
    cpu = CPU_PLATFORMS[target]
    cc = {"CC": f"{cpu.triplet}-gcc", "CXX": f"{cpu.triplet}-g++"} if compilers else {}
    return {
        "target": target,
        "target_dir": target_dir,
        "wheelhouse": wheelhouse,
        "requirements": list(requirements),
        "pip_args": ["--no-deps", *pip_for_platform(python, pip_platforms)],
        "env": {
            **cc,
            "_PYTHON_HOST_PLATFORM": f"linux-{target}",
            "_PYTHON_SYSCONFIGDATA_NAME": f"_sysconfigdata__{cpu.triplet}",
        },
    }


# -- the target's Python, run under qemu-user (the import check of a cross-built wheel) --------

# Debian suites by the Python they ship: the sysroot's interpreter must be the cell's.
SYSROOT_SUITES = {python: suite for suite, python in SUITE_PYTHONS.items()}
SYSROOT_STAMP = ".factory-sysroot"
# What the emulated program reads about its CPU. qemu-user shows the host's /proc/cpuinfo and
# /sys/devices/system/cpu, and torch's CPU probing (cpuinfo, xbyak_aarch64) crashes on x86 ones
# (seen: SIGSEGV while loading torch._C, qemu 7.2). qemu opens <sysroot>/<path> instead of <path>
# when that file exists, so the sysroot describes one Neoverse-N1 core.
_FAKE_CPU_FILES = {
    "proc/cpuinfo": (
        "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 "
        "crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\n"
        "CPU revision\t: 1\n\n"
    ),
    "sys/devices/system/cpu/online": "0\n",
    "sys/devices/system/cpu/possible": "0\n",
    "sys/devices/system/cpu/present": "0\n",
    "sys/devices/system/cpu/cpu0/regs/identification/midr_el1": "0x00000000413fd0c1\n",
    "sys/devices/system/cpu/cpu0/regs/identification/revidr_el1": "0x00000000\n",
    **{
        f"sys/devices/system/cpu/cpu0/topology/{name}": "0\n"
        for name in (
            "physical_package_id",
            "core_id",
            "cluster_id",
            "cluster_cpus_list",
            "core_siblings_list",
            "thread_siblings_list",
            "package_cpus_list",
            "core_cpus_list",
        )
    },
    **{
        f"sys/devices/system/cpu/cpu0/cache/index{i}/{key}": value
        for i, (level, kind, size) in enumerate(
            (("1", "Data", "64K"), ("1", "Instruction", "64K"), ("2", "Unified", "1024K"))
        )
        for key, value in (
            ("level", f"{level}\n"),
            ("type", f"{kind}\n"),
            ("size", f"{size}\n"),
            ("shared_cpu_list", "0\n"),
            ("shared_cpu_map", "1\n"),
            ("coherency_line_size", "64\n"),
            ("ways_of_associativity", "4\n"),
        )
    },
}


def find_qemu(target: str) -> str | None:
    """qemu-user for ``target`` (qemu-user-static's name first)."""
    return shutil.which(f"qemu-{target}-static") or shutil.which(f"qemu-{target}")


def sysroot_suite(python: str) -> str | None:
    return SYSROOT_SUITES.get(python)


def ensure_target_sysroot(
    root: Path, *, target: str, python: str, mirror: str | None = None
) -> Path:
    """A Debian root filesystem of ``target`` with the cell's Python (and pip, so that it also
    serves as an emulated host: tests install from the index with it), for qemu-user's ``-L``:
    ``root/sysroot-<suite>-<arch>``. Made once with ``debootstrap --foreign`` and the packages
    unpacked with ``dpkg-deb -x`` (no emulated second stage: the interpreter needs files, not
    configured packages). Raises EngineError when no Debian suite ships that Python."""
    suite = sysroot_suite(python)
    if suite is None:
        raise EngineError(
            f"no {target} Python {python} to run the import check with: Debian ships "
            f"{', '.join(f'{v} ({s})' for v, s in SYSROOT_SUITES.items())}",
            tip="skip the import check (--no-import) or build that Python on a native builder",
        )
    arch = CPU_PLATFORMS[target].debian_arch
    dest = root / f"sysroot-{suite}-{arch}"
    stamp = f"{suite} {arch} python{python} python3-pip\n"
    if (dest / SYSROOT_STAMP).is_file() and (dest / SYSROOT_STAMP).read_text() == stamp:
        return dest
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".sysroot-{suite}-{arch}.", dir=root))
    log = root / f"sysroot-{suite}-{arch}.log"
    try:
        debootstrap_foreign(staging, suite=suite, arch=arch,
                            packages=(f"python{python}", "python3-pip"),
                            mirror=mirror or os.environ.get("DEBIAN_MIRROR", DEBIAN_MIRROR),
                            log=log)
        for rel, text in _FAKE_CPU_FILES.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (staging / SYSROOT_STAMP).write_text(stamp)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
