"""factory matrix [--matrix PATH] [--json] [--missing --store STORE]"""

from __future__ import annotations

import argparse

from factory.build.readiness import ReadinessChecker
from factory.commands._common import (
    add_matrix_arg,
    add_store_arg,
    matrix_from_args,
    print_json,
    store_from_args,
)
from factory.matrix.load import PlannedCell
from factory.store import open_existing_store


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_selection_args(parser)


def add_selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--missing", action="store_true",
                        help="only cells not yet published in --store")
    add_store_arg(parser)
    parser.add_argument("--package", action="append", default=None, help="only these packages")


def selected_cells(args: argparse.Namespace) -> list[PlannedCell]:
    """The matrix's cells, narrowed by --package and --missing (shared with 'factory schedule')."""
    matrix = matrix_from_args(args)
    cells = matrix.cells_of(args.package)
    if args.missing:
        store = open_existing_store(store_from_args(args))
        published = store.published_content_keys()
        cells = [c for c in cells if c.content_key not in published]
    return cells


def run(args: argparse.Namespace) -> int:
    cells = selected_cells(args)

    checker = ReadinessChecker(matrix_from_args(args).settings)
    ready = {c.cell.id: checker.check(c) for c in cells}
    if args.json:
        print_json({
            "cells": [{**c.as_dict(),
                       "toolchain_ready": ready[c.cell.id].as_dict()} for c in cells],
            "include": [{"cell": c.cell.id} for c in cells],
        })
        return 0
    for c in cells:
        tc = c.toolchain
        print(f"{c.cell.id}")
        print(f"    wheel     {c.wheel}")
        print(f"    toolchain CUDA {tc.cuda} from {tc.nvcc_source}; {tc.torch_requirement}"
              + (f" from {tc.torch_index}" if tc.torch_index else " from PyPI"))
        print(f"    here      {ready[c.cell.id].line()}")
        print(f"    key       {c.content_key} (recipe {c.recipe.name} rev {c.recipe.revision})")
    missing = sum(not r.buildable for r in ready.values())
    print(f"{len(cells)} cell(s)" + (f", {missing} without a toolchain here" if missing else ""))
    return 0
