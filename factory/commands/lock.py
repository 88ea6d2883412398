"""factory lock [--matrix PATH] [--check] [--offline] [--json]

Resolves matrix.toml's rules against the indexes and writes ``<matrix>.lock`` beside it when a
cell changed. ``--check`` writes nothing, prints what a refresh would add or drop, and exits 1
when the lock would change.
"""

from __future__ import annotations

import argparse

from factory.commands._common import add_matrix_arg, print_json
from factory.matrix.lock import change_summary, change_table, declared_lines
from factory.matrix.paths import matrix_path
from factory.matrix.refresh import refresh_lock


def configure(parser: argparse.ArgumentParser) -> None:
    add_matrix_arg(parser)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a refresh would change the lock")
    parser.add_argument("--offline", action="store_true",
                        help="resolve against the facts this builder has (the cache under the "
                        "work dir, else the shipped snapshot) instead of reading the indexes")
    parser.add_argument("--timeout", type=float, default=30, metavar="SECONDS",
                        help="per request to an index (default 30)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    path = matrix_path(args.matrix)
    result = refresh_lock(path, offline=args.offline, check=args.check, timeout=args.timeout)
    lock = result.new
    counts = f"{len(lock.cells)} cell(s), {len(lock.skips)} known not to build"
    if args.json:
        print_json({
            "lock": str(result.path), "changed": result.differs, "written": result.written,
            "facts": {"kind": result.facts.kind, "generated": result.facts.generated,
                      "notes": list(result.facts.notes)},
            "cells": len(lock.cells), "skips": len(lock.skips),
            "declared": sorted(c.id for c in lock.cells if c.declared),
            "changes": [{"change": c.kind, "cell": c.cell, "detail": c.detail}
                        for c in result.changes],
        })
        return 1 if (args.check and result.differs) else 0
    print(f"lock {result.path} against {result.facts.describe()}")
    for note in result.facts.notes:
        print(f"note: {note}")
    for line in change_table(result.changes):
        print(line)
    for line in declared_lines((c.torch, c.cuda, c.torch_index) for c in lock.cells
                               if c.declared):
        print(line)
    if not result.differs:
        print(f"{result.path.name} is current: {counts}; nothing changed")
        return 0
    summary = change_summary(result.changes)
    if args.check:
        print(f"{result.path.name} is out of date ({summary}); 'factory lock' writes it")
        return 1
    print(f"wrote {result.path.name}: {counts} ({summary})")
    return 0
