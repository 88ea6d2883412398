"""factory image base [--name NAME] [--suite SUITE]"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from factory.errors import UsageError
from factory.toolchain.images import DEFAULT_BASE_IMAGE, ensure_base_image, is_image_reference


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


def run(args: argparse.Namespace) -> int:
    if not is_image_reference(args.name):
        raise UsageError(
            f"--name {args.name!r} is not a valid image name",
            tip="lowercase letters, digits and . _ - separators, an optional :tag "
            f"(e.g. {DEFAULT_BASE_IMAGE})",
        )
    work_dir = args.work_dir or _work_dir()
    start = time.monotonic()
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
