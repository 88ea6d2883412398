"""factory wheelhouse CELL [--matrix PATH] [--root DIR]"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from factory.commands._common import add_matrix_arg, matrix_from_args
from factory.toolchain.cross import builder_platform, is_cross
from factory.toolchain.wheelhouse import build_requirements, prepare_wheelhouse
from factory.units import format_size


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", metavar="CELL", help="cell id ('factory matrix' lists them)")
    add_matrix_arg(parser)
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="wheelhouse root (default: the matrix's settings.wheelhouse)",
    )


def run(args: argparse.Namespace) -> int:
    matrix = matrix_from_args(args)
    pc = matrix.find(args.cell, outside=True)
    root = args.root
    if root is None:
        root = matrix.settings.wheelhouse
    start = time.monotonic()
    dests = [prepare_wheelhouse(pc, root, platform=builder_platform())]
    if is_cross(pc.cell):  # and the target's torch, for a cross build and its import check
        dests.append(prepare_wheelhouse(pc, root, platform=pc.cell.platform, build_deps=False))
    for dest in dests:
        wheels = sorted(dest.glob("*.whl"))
        size = sum(w.stat().st_size for w in wheels)
        print(
            f"wheelhouse {dest}: {len(wheels)} wheels, {format_size(size)} "
            f"({time.monotonic() - start:.0f} s)"
        )
    print(f"    for {', '.join(build_requirements(pc))}")
    return 0
