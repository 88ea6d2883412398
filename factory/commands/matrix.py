"""factory matrix [--matrix PATH] [--json] [--missing --store STORE] [--package P] [--summary]
[--html [FILE]]

A short summary first (cells per package, how many can be built here and why not, how many are
known not to build), then where each fact the cells rest on came from and how old it is, then
every cell, then the cells known not to build with their reasons. With --html, the coverage grid
as a page instead.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from factory.build.readiness import Readiness, ReadinessChecker
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
from factory.matrix.expand import Skipped
from factory.matrix.load import Matrix, PlannedCell
from factory.matrix.lock import declared_lines
from factory.matrix.refresh import facts_used
from factory.reports.coverage import coverage, coverage_html
from factory.reports.page import write_page
from factory.store import open_existing_store, open_store
from factory.store.base import published
from factory.upstream.facts import age


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    add_selection_args(parser)
    parser.add_argument(
        "--html", nargs="?", const="", default=None, metavar="FILE",
        help="write the coverage grid (built, missing, cannot build) as a page: to FILE, or "
        "without FILE into the store's index tree as coverage/index.html")
    parser.add_argument("--summary", action="store_true",
                        help="only the summary and the facts, not every cell")


def add_selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--missing", action="store_true",
                        help="only cells not yet published in --store")
    add_store_arg(parser)
    parser.add_argument("--package", action="append", default=None, help="only these packages")


def selected_cells(args: argparse.Namespace, matrix: Matrix | None = None) -> list[PlannedCell]:
    """The matrix's cells, narrowed by --package and --missing (shared with 'factory schedule'
    and 'factory build --missing'). A cell counts as published when its content key or its
    wheel's filename is in the store."""
    matrix = matrix or matrix_from_args(args)
    cells = matrix.cells_of(args.package)
    if args.missing:
        spec = store_from_args(args)
        # a build that publishes makes its store: until then, every cell is missing
        opened = open_store(spec) if getattr(args, "publish", False) else open_existing_store(spec)
        have = published(opened)
        cells = [c for c in cells if not have.has(c.content_key, c.wheel)]
    return cells


def run(args: argparse.Namespace) -> int:
    if args.html is not None:
        return write_coverage(args)
    matrix = matrix_from_args(args)
    cells = selected_cells(args, matrix)
    checker = ReadinessChecker(matrix.settings)
    ready = {c.cell.id: checker.check(c) for c in cells}
    wanted = {matrix.package(p).name for p in args.package} if args.package else None
    skipped = [s for s in matrix.skipped if wanted is None or s.package in wanted]
    facts = _facts_lines(matrix, cells)
    if args.json:
        print_json({
            "cells": [{**c.as_dict(), "toolchain_ready": ready[c.cell.id].as_dict()}
                      for c in cells],
            "include": [{"cell": c.cell.id} for c in cells],
            "skipped": [s.as_dict() for s in skipped],
            "lock": {"path": str(matrix.lock_file) if matrix.lock_file else None,
                     "state": matrix.lock_state,
                     "locked": matrix.lock.locked if matrix.lock else None},
            "facts": [{"what": what, "source": where} for what, where in facts],
        })
        return 0
    for line in _summary(matrix, cells, ready, skipped):
        print(line)
    print("where the facts came from")
    for what, where in facts:
        print(f"    {what}")
        print(f"        {where}")
    if args.summary:
        return 0
    print("cells")
    for c in cells:
        tc = c.toolchain
        print(f"{c.cell.id}")
        print(f"    wheel     {c.wheel}")
        print(f"    toolchain CUDA {tc.cuda} from {tc.nvcc_source}; {tc.torch_requirement}"
              + (f" from {tc.torch_index}" if tc.torch_index else " from PyPI")
              + (" (a declared build: unverified)" if c.torch_declared else ""))
        if c.sha256:
            print(f"    sdist     {c.sdist or c.cell.package} sha256 {c.sha256}")
        print(f"    here      {ready[c.cell.id].line()}")
        print(f"    key       {c.content_key} (recipe {c.recipe.name} rev {c.recipe.revision})")
    if skipped:
        print("known not to build (never attempted)")
        for s in skipped:
            print(f"{s.cell}")
            print(f"    why       {s.reason}")
    missing = sum(not r.buildable for r in ready.values())
    print(f"{len(cells)} cell(s)" + (f", {missing} without a toolchain here" if missing else "")
          + (f"; {len(skipped)} known not to build" if skipped else ""))
    return 0


def write_coverage(args: argparse.Namespace) -> int:
    """The coverage page: the whole matrix (or --package) against the store."""
    matrix = matrix_from_args(args)
    spec = store_from_args(args)
    try:
        have = open_existing_store(spec).published_content_keys()
    except StoreError:
        if not args.html:
            raise  # the page goes into that store: it must exist
        have = set()  # nothing published yet: everything is missing
    checker = ReadinessChecker(matrix.settings)

    def readiness(pc: PlannedCell) -> tuple[bool, str]:
        r = checker.check(pc)
        return r.buildable, r.line()

    grids = coverage(matrix, published=have, readiness=readiness)
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


def _summary(matrix: Matrix, cells: list[PlannedCell], ready: dict[str, Readiness],
             skipped: list[Skipped]) -> list[str]:
    where = str(matrix.path or "the matrix")
    if matrix.lock_state == "locked" and matrix.lock is not None:
        source = f"cells from {matrix.lock_file} (locked {matrix.lock.locked})"
    elif matrix.lock_state == "stale":
        source = (f"{matrix.lock_file} is out of date with {where} (its rules changed): cells "
                  f"resolved against {matrix.facts.describe()}; 'factory lock' writes it")
    else:
        source = f"no lock: cells resolved against {matrix.facts.describe()}"
    lines = [f"matrix {where}: {source}"]
    per_package: dict[str, list[PlannedCell]] = defaultdict(list)
    for c in cells:
        per_package[c.cell.package].append(c)
    skips = Counter(s.package for s in skipped)
    names = sorted(set(per_package) | set(skips))
    width = max((len(n) for n in names), default=7)
    lines.append(f"    {'package':{width}}  cells  here  not here  known not to build")
    for name in names:
        mine = per_package.get(name, [])
        here = sum(ready[c.cell.id].buildable for c in mine)
        lines.append(f"    {name:{width}}  {len(mine):5}  {here:4}  {len(mine) - here:8}  "
                     f"{skips.get(name, 0):18}")
    why = Counter((r.detail, r.command) for r in ready.values() if not r.buildable)
    for (detail, command), n in why.most_common():
        lines.append(f"    not here: {n} cell(s): {detail}" + (f"; make it: {command}" if command
                                                              else ""))
    lines += [f"    {line}" for line in declared_lines(
        (c.cell.torch, c.cell.cuda, c.toolchain.torch_index or "") for c in cells
        if c.torch_declared)]
    return lines


def _facts_lines(matrix: Matrix, cells: list[PlannedCell]) -> list[tuple[str, str]]:
    """(what, where it came from and how old it is) for the facts the cells rest on: the
    lock's record when the cells come from it, else what the facts at hand say."""
    used = matrix.lock.facts if matrix.lock is not None else facts_used(cells, matrix.facts)
    out = [(f.what, f.origin.describe()) for f in used]
    kind = "locked with" if matrix.lock is not None else "resolved against"
    out.append((f"the facts this builder has now ({kind}: see above)",
                f"{matrix.facts.describe()}, {age(matrix.facts.generated)} old"
                + (f"; {'; '.join(matrix.facts.notes)}" if matrix.facts.notes else "")))
    return out
