"""factory show WHEEL|CELL [--store STORE] [--json]

WHEEL is a wheel path (its manifest sits next to it, else the store's is read), a wheel
filename (looked up in the store) or a manifest path; CELL is a cell id, which shows every
published build of that cell, oldest first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from packaging.utils import parse_wheel_filename

from factory.commands._common import add_store_arg, print_json, store_from_args
from factory.errors import CellError, WheelError
from factory.matrix.cell import Cell
from factory.store import open_store
from factory.wheels.provenance import (
    SUFFIX,
    Manifest,
    manifest_name,
    published_builds,
    read_manifest,
    render_text,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="WHEEL|CELL",
                        help="a wheel path or filename, or a cell id")
    add_store_arg(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _from_file(path: Path) -> Manifest | None:
    if not path.name:  # '', '.', '/': no file name to look for
        return None
    if path.name.endswith(SUFFIX) and path.is_file():
        return read_manifest(path)
    side = path.with_name(manifest_name(path.name))
    if path.name.endswith(".whl") and side.is_file():
        return read_manifest(side)
    return None


def _lookup(args: argparse.Namespace) -> list[tuple[Manifest, str | None]]:
    target = str(args.target)
    local = _from_file(Path(target))
    if local is not None:
        return [(local, None)]
    name = Path(target).name
    if name.endswith(SUFFIX):
        name = name[: -len(SUFFIX)]
    store_spec = store_from_args(args)
    if name.endswith(".whl"):
        try:
            project = str(parse_wheel_filename(name)[0])
        except Exception as exc:  # packaging raises several InvalidWheelFilename kinds
            raise WheelError(f"invalid wheel filename {name!r}: {exc}") from None
        builds = [b for b in published_builds(open_store(store_spec),
                                              project) if b.manifest.wheel == name]
        if not builds:
            raise WheelError(
                f"no provenance for {name} next to it or in the store {store_spec}",
                tip="pass --store to look in another store",
            )
        return [(b.manifest, b.yanked) for b in builds]

    cell = Cell.from_id(target)  # raises CellError with the id format as a tip
    builds = [
        b for b in published_builds(open_store(store_spec),
                                    cell.package) if b.manifest.cell.id == cell.id
    ]
    if not builds:
        raise CellError(f"no published build of {cell.id} in the store {store_spec}",
                        tip="'factory matrix --missing' lists the cells not yet built")
    return [(b.manifest, b.yanked) for b in builds]


def run(args: argparse.Namespace) -> int:
    found = _lookup(args)
    if args.json:
        print_json({
            "manifests": [m.to_dict() for m, _ in found],
            "yanked": {m.wheel: reason for m, reason in found if reason is not None},
        })
        return 0
    print("\n\n".join(render_text(m, yanked=reason) for m, reason in found))
    return 0
