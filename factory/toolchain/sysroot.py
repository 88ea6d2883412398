"""The glibc sysroot: wheels for hosts older than the builder, with the builder's own compiler.

The C and C++ runtime a binary links against decides the oldest host it loads on (its glibc
floor, ``factory.wheels.floor``). The base image's g++ 12 is new enough for torch 2.14's C++20
(GCC 10, the compiler of every glibc <= 2.31 Debian, reports ``__cplusplus`` 201709 and torch's
``ATen.h`` refuses it); its glibc 2.36 and libstdc++ are too new for the hosts that exist. So the
factory compiles with the builder's g++ against Debian bullseye's glibc 2.31 and libstdc++ 10
(headers and shared objects to link against, nothing else): ``--sysroot`` plus the older C++
headers. What the binaries need is then at most glibc 2.31 and GLIBCXX_3.4.28 (manylinux_2_31)
by construction, and manylinux_2_28 (torch's own floor) when nothing from glibc 2.29-2.31 is
used; the build checks that on the binaries after compiling (``wheels.floor``).

The sysroot is made once with debootstrap (bullseye is on the Debian mirror; buster, with glibc
2.28, is not), for the builder's CPU or, for cross builds (``factory.toolchain.cross``), for the
target's: an arm64 bullseye (``debootstrap --foreign``, only unpacked) under the cross compiler
``aarch64-linux-gnu-g++`` gives aarch64 wheels the same floor. It is cached as a tarball (about
30 MB, so it can be carried to a GPU host without network or docker), and unpacked where it is
used. The wrappers in its ``bin/`` are what CC, CXX
and nvcc's ``-ccbin`` point at; they find the sysroot from their own location, so the tree works
at any path: mounted into the build container, or unpacked on a host for the local runner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from factory.errors import EngineError, ToolchainError
from factory.matrix.manylinux import glibc_text, manylinux_name, parse_floor
from factory.tarsafe import extract
from factory.toolchain.cross import CPU_PLATFORMS, builder_platform
from factory.toolchain.images import (
    DEBIAN_MIRROR,
    _debootstrap_tarball,
    debootstrap,
    debootstrap_foreign,
)

SUITE = "bullseye"
# What is linked against: glibc (libc6-dev) and libstdc++ 10 (libstdc++-10-dev); the kernel
# headers come with libc6-dev.
PACKAGES = ("libc6-dev", "libstdc++-10-dev")
GLIBC = (2, 31)  # bullseye's: the floor the sysroot reaches by construction
GCC_RUNTIME = "10"  # the libstdc++ headers and library of the sysroot
# The lowest floor a build with the sysroot is accepted for: torch's own wheels are
# manylinux_2_28, so nothing lower is worth promising; between 2_28 and 2_31 the binaries are
# checked after compiling.
REACH = (2, 28)
# Of the root filesystem only what a compile and a link read: headers and libraries
# ("{triplet}": the CPU's GNU triplet, x86_64-linux-gnu or aarch64-linux-gnu).
KEEP = ("usr/include", "usr/lib/{triplet}", "usr/lib/gcc/{triplet}", "usr/lib64", "lib", "lib64")
# Never read by a compile or a link: the compiler proper and plugins of bullseye's own gcc.
# Nor what the base image's other packages (python3, apt, binutils) bring, nor static archives
# a torch extension never links (libc_nonshared.a stays: libc.so names it).
DROP = ("cc1", "cc1plus", "collect2", "lto1", "lto-wrapper", "plugin", "libcc1.so*", "gconv",
        "perl", "perl5", "perl-base", "apt", "dpkg", "python3*", "libpython3*", "audit",
        "lib[atlu]san*", "libubsan*", "libc.a", "libm.a", "libm-*.a", "libpthread.a",
        "libstdc++.a", "libcrypto*", "libssl*", "libmpfr*", "libisl*", "libgnutls*", "libapt*",
        "libdb-*", "libbfd*", "libopcodes*", "libsqlite3*", "libp11*", "ldscripts",
        "libunistring*", "libperl*", "libx86.a", "libasan.a", "libtsan.a")
MARKER = ".factory-sysroot"
_log = logging.getLogger(__name__)
PYTHON_MINORS = range(8, 16)  # the CPython 3.X whose multiarch headers the sysroot leads to

WRAPPER = """#!/bin/sh
# The factory's sysroot wrapper: this host's {driver}, Debian {suite}'s glibc {glibc} and
# libstdc++ {gcc} for {triplet} (factory/toolchain/sysroot.py). FACTORY_SYSROOT_{var} names
# another {driver}. {driver} 13 and newer cannot compile torch's headers against libstdc++
# {gcc}'s (measured on an Ubuntu 24.04 host: std::is_nothrow_invocable_r in <type_traits>), so a
# {driver}-12 or -11 beside them is taken first.
sysroot="$(dirname "$(dirname "$(readlink -f "$0")")")"
driver="${{FACTORY_SYSROOT_{var}:-$(command -v {driver}-12 || command -v {driver}-11 || command -v {driver} || echo /usr/bin/{driver})}}"
exec "$driver" --sysroot="$sysroot" -nostdinc++ \\
    -isystem "$sysroot/usr/include/c++/{gcc}" \\
    -isystem "$sysroot/usr/include/{triplet}/c++/{gcc}" \\
    -isystem "$sysroot/usr/include/c++/{gcc}/backward" \\
    -B"$sysroot/usr/lib/{triplet}/" -L"$sysroot/usr/lib/gcc/{triplet}/{gcc}" \\
    -L"$sysroot/usr/lib/{triplet}" "$@"
"""  # noqa: E501 - the driver line stays one shell line: the text is part of the sysroot's key
# Why -B and -L: the driver's own library dirs are relative to the compiler's prefix, not to
# --sysroot (/usr/lib/gcc/x86_64-linux-gnu/12/../../../x86_64-linux-gnu is the builder's), so
# without them libc.so, libm.so and crti.o would come from the builder and bind GLIBC_2.34
# symbols (measured: __pthread_key_create@GLIBC_2.34 in a sysroot build without them).


def _cpu(platform: str) -> Any:
    return CPU_PLATFORMS[platform]


def _driver(platform: str, name: str) -> str:
    """The compiler driver the wrappers call: 'g++' on the builder's own CPU, the cross
    compiler ('aarch64-linux-gnu-g++') for another."""
    return name if platform == builder_platform() else f"{_cpu(platform).triplet}-{name}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sysroot:
    root: Path

    @property
    def cc(self) -> Path:
        return self.root / "bin" / "gcc"

    @property
    def cxx(self) -> Path:
        return self.root / "bin" / "g++"

    @property
    def glibc(self) -> tuple[int, int]:
        return GLIBC

    def build_env(self, root: str | None = None) -> dict[str, str]:
        """CC, CXX and the link commands for a build (``root``: where the tree is seen from,
        e.g. its mount point in a container). torch passes CC to nvcc as ``-ccbin``."""
        base = root or str(self.root)
        cc, cxx = f"{base}/bin/gcc", f"{base}/bin/g++"
        return {"CC": cc, "CXX": cxx, "LDSHARED": f"{cc} -shared",
                "LDCXXSHARED": f"{cxx} -shared"}

    def as_dict(self) -> dict[str, Any]:
        return {"suite": SUITE, "glibc": glibc_text(GLIBC), "libstdcxx": f"gcc {GCC_RUNTIME}",
                "key": key()}


def sysroot_env(root: Path | None, seen_at: str | None = None) -> dict[str, str]:
    """The build environment for a sysroot at ``root`` (seen at ``seen_at`` by the build, e.g.
    its mount point in a container); nothing without one."""
    return {} if root is None else Sysroot(root=Path(root)).build_env(seen_at)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FloorPlan:
    """How a build keeps the glibc floor its cell promises, decided before compiling."""

    promised: tuple[int, int] | None  # None: "auto", the builder's own glibc
    builder: tuple[int, int]  # the glibc the builder's compilers link against on their own
    sysroot: bool  # compile against the sysroot's glibc 2.31 and libstdc++ 10

    @property
    def linked(self) -> tuple[int, int]:
        return GLIBC if self.sysroot else self.builder

    @property
    def checked(self) -> bool:
        """The promise holds only if the binaries use nothing newer: checked after compiling."""
        return self.promised is not None and self.promised < self.linked

    def describe(self) -> str:
        want = "auto" if self.promised is None else manylinux_name(self.promised)
        how = (f"the {SUITE} sysroot (glibc {glibc_text(GLIBC)}, libstdc++ {GCC_RUNTIME})"
               if self.sysroot else f"the builder's own glibc {glibc_text(self.builder)}")
        check = ", binaries checked after compiling" if self.checked else ""
        return f"glibc floor {want}: {how}{check}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "promised": None if self.promised is None else glibc_text(self.promised),
            "builder_glibc": glibc_text(self.builder),
            "sysroot": self.sysroot,
            "linked_glibc": glibc_text(self.linked),
        }


def plan_floor(manylinux: str, *, builder: tuple[int, int], sysroot: str, where: str) -> FloorPlan:
    """Whether ``manylinux`` ("2_28", "auto") is reachable from a builder whose glibc is
    ``builder``, and how; ToolchainError (before anything compiles) when it is not."""
    if manylinux == "auto":
        return FloorPlan(promised=None, builder=builder, sysroot=False)
    want = parse_floor(manylinux)
    if builder <= want:
        return FloorPlan(promised=want, builder=builder, sysroot=False)
    floor = manylinux_name(want)
    have = glibc_text(builder)
    if sysroot == "none":
        raise ToolchainError(
            f"{floor} is not reachable: {where} links against glibc {have} and "
            "[settings] sysroot is \"none\"",
            tip=f'set sysroot = "{SUITE}" (reaches manylinux_2_28), or manylinux = '
            f'"{builder[0]}_{builder[1]}" for this builder\'s own floor',
        )
    if want < REACH:
        raise ToolchainError(
            f"{floor} is not reachable: the lowest floor the factory builds for is "
            f"manylinux_{REACH[0]}_{REACH[1]} (torch's own wheels need glibc "
            f"{REACH[0]}.{REACH[1]}; {where} links against glibc {have})",
            tip=f'use manylinux = "{REACH[0]}_{REACH[1]}"',
        )
    return FloorPlan(promised=want, builder=builder, sysroot=True)


def key(platform: str = "x86_64") -> str:
    """Changes whenever what goes into the sysroot changes (its tarball's and directory's name)."""
    text = "\n".join([SUITE, *PACKAGES, *KEEP, *DROP, WRAPPER, f"python {list(PYTHON_MINORS)}",
                      *([] if platform == "x86_64" else [platform])])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _name(platform: str) -> str:
    """'bullseye-<key>' for x86_64, 'bullseye-arm64-<key>' for another CPU."""
    arch = "" if platform == "x86_64" else f"{_cpu(platform).debian_arch}-"
    return f"{SUITE}-{arch}{key(platform)}"


def sysroot_dir(cache: Path, platform: str = "x86_64") -> Path:
    """Where the unpacked sysroot lives in the sysroot cache (``<cache>/bullseye-<key>``)."""
    return Path(cache) / _name(platform)


def tarball_path(cache: Path, platform: str = "x86_64") -> Path:
    return Path(cache) / f"sysroot-{_name(platform)}.tar.gz"


def ensure_sysroot(cache: Path, *, mirror: str | None = None, tarball: Path | None = None,
                   rootfs: Path | None = None, platform: str = "x86_64") -> Sysroot:
    """The sysroot for ``platform``'s binaries in ``cache``: unpacked from its tarball
    (``tarball``, else the cached one), made with debootstrap when there is none (root and the
    Debian mirror needed)."""
    root = sysroot_dir(cache, platform)
    if (root / MARKER).is_file():
        return Sysroot(root=root.resolve())
    archive = Path(tarball) if tarball else tarball_path(cache, platform)
    if not archive.is_file():
        if tarball:
            raise EngineError(f"sysroot tarball {archive} does not exist")
        make_tarball(archive, mirror=mirror, rootfs=rootfs, platform=platform)
    unpack(archive, root)
    return Sysroot(root=root.resolve())


def unpack(archive: Path, root: Path) -> None:
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        with tarfile.open(archive) as tf:
            extract(tf, partial, trusted=True)
    except (OSError, tarfile.TarError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise EngineError(f"cannot unpack sysroot {archive}: {exc}") from None
    if not (partial / MARKER).is_file():
        shutil.rmtree(partial, ignore_errors=True)
        raise EngineError(f"{archive} is not a factory sysroot (no {MARKER} in it)")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(partial, root)


def make_tarball(archive: Path, *, mirror: str | None = None, rootfs: Path | None = None,
                 platform: str = "x86_64") -> Path:
    """Keep headers and libraries of a bullseye root filesystem, add the wrappers, pack.

    ``rootfs``: the cached tarball of the factory's bullseye base image (its g++ brings
    libstdc++-10-dev and libc6-dev), made first when missing, so that one debootstrap serves
    both the sysroot and a ``factory-base:bullseye`` image; without it, a debootstrap of just
    the two packages (for another CPU than the builder's: downloaded and unpacked, never run)."""
    mirror = mirror or os.environ.get("DEBIAN_MIRROR", DEBIAN_MIRROR)
    archive.parent.mkdir(parents=True, exist_ok=True)
    log = archive.parent / f"debootstrap-sysroot-{_name(platform)}.log"
    with tempfile.TemporaryDirectory(prefix="sysroot.", dir=archive.parent) as tmp:
        full = Path(tmp) / "rootfs"
        if platform != builder_platform():
            debootstrap_foreign(full, suite=SUITE, arch=_cpu(platform).debian_arch,
                                packages=PACKAGES, mirror=mirror, log=log)
        elif rootfs is not None:
            if not rootfs.is_file() or rootfs.stat().st_size == 0:
                _debootstrap_tarball(rootfs, suite=SUITE, mirror=mirror)
            _extract_kept(rootfs, full, platform)
        else:
            debootstrap(full, suite=SUITE, packages=PACKAGES, mirror=mirror, log=log)
        lean = Path(tmp) / "sysroot"
        prune(full, lean, platform)
        partial = archive.with_name(archive.name + ".partial")
        with tarfile.open(partial, "w:gz") as tf:
            tf.add(lean, arcname=".")
        os.replace(partial, archive)
    _log.info(f"+ sysroot {archive} ({archive.stat().st_size / 2**20:.0f} MiB)")
    return archive


def _kept(platform: str) -> tuple[str, ...]:
    return tuple(k.format(triplet=_cpu(platform).triplet) for k in KEEP)


def _extract_kept(rootfs: Path, full: Path, platform: str) -> None:
    """Only the members under KEEP: a root filesystem is 600 MB, its headers and libraries 110."""
    keep = _kept(platform)
    prefixes = tuple(f"{k}/" for k in keep)
    try:
        with tarfile.open(rootfs) as tf:
            members = [m for m in tf.getmembers()
                       if (name := m.name.removeprefix("./")) in keep or name.startswith(prefixes)]
            extract(tf, full, trusted=True, members=members)
    except (OSError, tarfile.TarError) as exc:
        raise EngineError(f"cannot read the root filesystem {rootfs}: {exc}") from None


def prune(full: Path, lean: Path, platform: str = "x86_64") -> None:
    """Copy what compiles and links read from ``full`` into ``lean``; every absolute symlink
    becomes relative (a link to /lib/... must not reach the builder's own glibc)."""
    triplet = _cpu(platform).triplet
    for rel in _kept(platform):
        src = full / rel
        if src.is_symlink():
            (lean / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), lean / rel)
        elif src.is_dir():
            shutil.copytree(src, lean / rel, symlinks=True,
                            ignore=shutil.ignore_patterns(*DROP), dirs_exist_ok=True)
    for link in [p for p in lean.rglob("*") if p.is_symlink()]:
        target = os.readlink(link)
        if target.startswith("/"):
            link.unlink()
            os.symlink(os.path.relpath(lean / target.lstrip("/"), link.parent), link)
    # Debian's and Ubuntu's Python.h include <x86_64-linux-gnu/python3.X/pyconfig.h>, which the
    # compiler looks up in the sysroot: these links (absolute on purpose) lead to the builder's
    # own, so a Python extension finds its interpreter's configuration (measured: flash-attn's
    # pybind11 code stops at "pyconfig.h: No such file or directory" without them). For a cross
    # sysroot they lead to the target's headers, which the cross image has as Debian multiarch.
    multiarch = lean / f"usr/include/{triplet}"
    multiarch.mkdir(parents=True, exist_ok=True)
    for minor in PYTHON_MINORS:
        link = multiarch / f"python3.{minor}"
        if not link.exists() and not link.is_symlink():
            os.symlink(f"/usr/include/{triplet}/python3.{minor}", link)
    bin_dir = lean / "bin"
    bin_dir.mkdir()
    for driver, var in (("gcc", "CC"), ("g++", "CXX")):
        path = bin_dir / driver
        path.write_text(WRAPPER.format(driver=_driver(platform, driver), var=var, suite=SUITE,
                                       glibc=glibc_text(GLIBC), gcc=GCC_RUNTIME, triplet=triplet))
        path.chmod(0o755)
    (lean / MARKER).write_text(
        f"{SUITE} {platform} glibc {glibc_text(GLIBC)} libstdc++ {GCC_RUNTIME} {key(platform)}\n")
