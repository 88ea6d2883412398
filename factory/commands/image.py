"""factory image base [--name NAME] [--suite SUITE]
factory image sysroot [--work-dir DIR] [--tarball PATH]"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from factory.toolchain.images import DEFAULT_BASE_IMAGE, ensure_base_image


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="image_command", metavar="WHAT", required=True)
    base = sub.add_parser("base", help="make the offline base image (debootstrap + docker import)")
    base.add_argument(
        "--name", default=DEFAULT_BASE_IMAGE, help=f"image name (default {DEFAULT_BASE_IMAGE})"
    )
    base.add_argument("--suite", default="bookworm", help="Debian suite (default bookworm)")
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


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    if args.image_command == "sysroot":
        from factory.toolchain.images import rootfs_tarball
        from factory.toolchain.sysroot import SUITE, ensure_sysroot, tarball_path

        work_dir = args.work_dir or _work_dir()
        cache = work_dir.parent / "sysroots"
        made = ensure_sysroot(cache, tarball=args.tarball,
                              rootfs=rootfs_tarball(work_dir, SUITE))
        print(f"sysroot {made.root} ready ({time.monotonic() - start:.0f} s); "
              f"tarball {args.tarball or tarball_path(cache)}")
        return 0
    work_dir = args.work_dir or _work_dir()
    name = ensure_base_image(args.name, suite=args.suite, work_dir=work_dir)
    print(f"image {name} ready ({time.monotonic() - start:.0f} s)")
    return 0


def _work_dir() -> Path:
    from factory.matrix.load import default_matrix_path, load_matrix
    from factory.matrix.settings import default_settings

    try:
        m = load_matrix(default_matrix_path())
    except Exception:  # no matrix here: the default layout
        return default_settings().work_dir
    return m.settings.work_dir
