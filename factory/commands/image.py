"""factory image base [--name NAME] [--suite SUITE]
factory image sysroot [--work-dir DIR] [--tarball PATH] [--platform CPU]
factory image cuda X.Y [--from DIR] [--python X.Y] [--base IMAGE] [--name NAME]"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from factory.errors import UsageError
from factory.matrix.cell import parse_platform
from factory.matrix.load import Matrix, load_matrix
from factory.matrix.paths import default_matrix_path
from factory.matrix.settings import Settings, default_settings, sysroots_beside
from factory.toolchain.images import (
    DEFAULT_BASE_IMAGE,
    ensure_base_image,
    is_image_reference,
    rootfs_tarball,
)
from factory.toolchain.python_image import (
    IMAGE_RE,
    SOURCE_SUITES,
    check_image_python,
    ensure_builder_image,
)
from factory.toolchain.redist import REDIST_URL, fetch_toolkit, make_cuda_image
from factory.toolchain.resolve import cuda_image_name
from factory.toolchain.sysroot import SUITE, ensure_sysroot, tarball_path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="image_command", metavar="WHAT", required=True)
    base = sub.add_parser("base", help="make the offline base image (debootstrap + docker import)")
    base.add_argument(
        "--name", default=DEFAULT_BASE_IMAGE, help=f"image name (default {DEFAULT_BASE_IMAGE})"
    )
    base.add_argument("--suite", default=None,
                      help="Debian suite (default: the one a factory-base:<suite>[-py<X.Y>] "
                      "name says, else bookworm)")
    base.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where the root filesystem tarball is cached (default: the matrix's work-dir)",
    )
    sysroot = sub.add_parser(
        "sysroot",
        help="make the glibc 2.31 sysroot that builds reach manylinux_2_28/2_31 with "
        "(debootstrap; its tarball can be carried to a host without network)",
    )
    sysroot.add_argument("--work-dir", type=Path, default=None,
                         help="the matrix's work-dir (default: the matrix's): the sysroot goes to "
                         "'sysroots' next to it, where builds look for it")
    sysroot.add_argument("--tarball", type=Path, default=None,
                         help="unpack this carried sysroot tarball instead of making one")
    sysroot.add_argument("--platform", default="x86_64", metavar="CPU",
                         help="the CPU of the binaries it links (x86_64, or aarch64 for cross "
                         "builds: an arm64 bullseye, unpacked without emulation)")

    cuda = sub.add_parser(
        "cuda", help="make the CUDA X.Y builder images (factory-cuda:X.Y-py<Python>) from NVIDIA's "
        "redistributable archives: the toolchain of CUDA 12.x cells",
    )
    cuda.add_argument("cuda", metavar="VERSION", help="the CUDA version, e.g. 12.8")
    cuda.add_argument(
        "--from", dest="source", default=None, metavar="DIR|URL",
        help="a local mirror of NVIDIA's redist tree (redistrib_X.Y.Z.json + archives), for "
        "builders without network (default: NVIDIA's server)",
    )
    cuda.add_argument("--base", default=None, help="the image to add the toolkit to "
                      "(default: the matrix's builder image for the Python); it must have "
                      "python<X.Y>")
    cuda.add_argument("--python", default=None, metavar="VERSION",
                      help="the Python the image builds cells of (default: one image per "
                      "Python of the matrix's CUDA X.Y cells)")
    cuda.add_argument("--name", default=None,
                      help="image name (default factory-cuda:X.Y-py<Python>, the name builds use)")


def _check_name(name: str) -> None:
    if not is_image_reference(name):
        raise UsageError(
            f"--name {name!r} is not a valid image name",
            tip="lowercase letters, digits and . _ - separators, an optional :tag "
            f"(e.g. {DEFAULT_BASE_IMAGE})",
        )


def run(args: argparse.Namespace) -> int:
    if args.image_command == "cuda":
        return _cuda(args)
    if args.image_command == "base":
        _check_name(args.name)
    start = time.monotonic()
    if args.image_command == "sysroot":
        platform = parse_platform(args.platform)
        work_dir = args.work_dir or _settings().work_dir
        cache = sysroots_beside(work_dir)
        made = ensure_sysroot(cache, tarball=args.tarball, platform=platform,
                              rootfs=rootfs_tarball(work_dir, SUITE))
        print(f"sysroot {made.root} ready ({time.monotonic() - start:.0f} s); "
              f"tarball {args.tarball or tarball_path(cache, platform)}")
        return 0
    work_dir = args.work_dir or _settings().work_dir
    name = _make_base(args.name, args.suite, work_dir)
    print(f"image {name} ready ({time.monotonic() - start:.0f} s)")
    return 0


def _make_base(name: str, suite: str | None, work_dir: Path) -> str:
    """A ``factory-base:<suite>[-py<X.Y>]`` name says what the image holds, and builds trust
    it: such an image is made as its name says (its suite, and its CPython built in). Any other
    name is the given suite's base image."""
    match = IMAGE_RE.match(name)
    if match is None:
        return ensure_base_image(name, suite=suite or "bookworm", work_dir=work_dir)
    named, python = match.group("suite"), match.group("python")
    if suite and suite != named:
        raise UsageError(
            f"--name {name} is a Debian {named} image, but --suite says {suite}",
            tip=f"drop --suite, or name it factory-base:{suite}"
            + (f"-py{python}" if python else ""),
        )
    if python and python not in SOURCE_SUITES:
        known = ", ".join(sorted(SOURCE_SUITES))
        raise UsageError(
            f"--name {name}: the factory can build CPython {known} into an image, not {python}",
            tip="name an image with one of those, or make your own and set it in "
            "[settings.images]",
        )
    return ensure_builder_image(name, work_dir=work_dir)


def _cuda(args: argparse.Namespace) -> int:
    matrix = _matrix()
    settings = matrix.settings if matrix else _settings()
    pythons = [args.python] if args.python else _cell_pythons(matrix, args.cuda)
    if not pythons:
        raise UsageError(
            f"no cell of the matrix uses CUDA {args.cuda}, so it does not say which Python "
            "the image is for",
            tip=f"name it: factory image cuda {args.cuda} --python X.Y",
        )
    if args.name and len(pythons) > 1:
        raise UsageError(
            f"--name names one image, but the matrix's CUDA {args.cuda} cells need one per "
            f"Python ({', '.join(pythons)})",
            tip="add --python X.Y",
        )
    images = [(python, args.base or settings.image_for(python),
               args.name or cuda_image_name(args.cuda, python)) for python in pythons]
    for _, base, name in images:
        _check_name(name)
        _check_name(base)
    start = time.monotonic()
    # before any download: each base must have its Python (what a name tells first, then the
    # made image itself)
    for python, base, _ in images:
        check_image_python(base, python, run_image=False)
    for python, base, _ in images:
        ensure_builder_image(base)
        check_image_python(base, python)
    source = args.source or REDIST_URL
    if args.source and "://" not in args.source:
        source = str(Path(args.source).absolute())
    home = fetch_toolkit(args.cuda, settings.toolkits_dir, source=source,
                         echo=lambda line: print(f"  {line}", flush=True))
    print(f"toolkit {home} ready")
    for python, base, name in images:
        make_cuda_image(home, args.cuda, base=base, name=name)
        print(f"image {name} ready (CUDA {args.cuda} on {base} for Python {python}, "
              f"{time.monotonic() - start:.0f} s)")
    return 0


def _cell_pythons(matrix: Any, cuda: str) -> list[str]:
    """The Pythons of the matrix's cells with this CUDA whose toolkit comes from an image."""
    if matrix is None:
        return []
    return sorted({pc.cell.python for pc in matrix.cells
                   if pc.cell.cuda == cuda and pc.toolchain.nvcc_source == "image"})


def _matrix() -> Matrix | None:
    path = default_matrix_path()
    if path is None:
        return None
    try:
        return load_matrix(path)
    except Exception:  # no matrix here: the default layout
        return None


def _settings() -> Settings:
    m = _matrix()
    return m.settings if m else default_settings()
