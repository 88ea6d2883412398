"""factory matrix [--matrix PATH] [--json] [--missing --store STORE] [--html [FILE]]"""

from __future__ import annotations

import argparse
from pathlib import Path

from factory.build.readiness import ReadinessChecker
from factory.commands._common import (
    add_matrix_arg,
    add_store_arg,
    matrix_from_args,
    print_json,
    store_from_args,
)
from factory.errors import StoreError
from factory.index.pages import COVERAGE_KEY
from factory.index.writer import cas_write
from factory.matrix.load import PlannedCell
from factory.reports.coverage import coverage, coverage_html
from factory.reports.page import write_page
from factory.store import open_existing_store, open_store


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_selection_args(parser)
    parser.add_argument(
        "--html", nargs="?", const="", default=None, metavar="FILE",
        help="write the coverage grid (built, missing, cannot build) as a page: to FILE, or "
        "without FILE into the store's index tree as coverage/index.html")


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
    if args.html is not None:
        return write_coverage(args)
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


def write_coverage(args: argparse.Namespace) -> int:
    """The coverage page: the whole matrix (or --package) against the store."""
    matrix = matrix_from_args(args)
    spec = store_from_args(args)
    try:
        published = open_existing_store(spec).published_content_keys()
    except StoreError:
        if not args.html:
            raise  # the page goes into that store: it must exist
        published = set()  # nothing published yet: everything is missing
    checker = ReadinessChecker(matrix.settings)

    def readiness(pc: PlannedCell) -> tuple[bool, str]:
        r = checker.check(pc)
        return r.buildable, r.line()

    grids = coverage(matrix, published=published, readiness=readiness)
    if args.package:
        wanted = {matrix.package(p).name for p in args.package}
        grids = [g for g in grids if g.package in wanted]
    text = coverage_html(grids, store=spec, matrix=str(matrix.path or "matrix.toml"))
    if args.html:
        path = write_page(Path(args.html), text)
        print(f"coverage page: {path}")
        return 0
    cas_write(open_store(spec), [COVERAGE_KEY], lambda: {COVERAGE_KEY: text.encode()})
    print(f"coverage page: {spec.rstrip('/')}/{COVERAGE_KEY}")
    return 0
