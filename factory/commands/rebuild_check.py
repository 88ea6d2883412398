"""factory rebuild-check CELL [--store STORE] [--matrix PATH] [--runner R] [--memory SIZE]

Rebuild a published cell from its source in a fresh tree and compare the wheel with the
published one, member by member: a way for users to trust the index. Where bytes differ, each
differing member is named with the reason the bytes show.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil

from factory.build.job import BuildOptions
from factory.build.pipeline import build_cell
from factory.commands._common import (
    add_matrix_arg,
    add_runner_arg,
    add_store_arg,
    matrix_from_args,
    store_from_args,
)
from factory.errors import CellError, VerifyError
from factory.logger import Log
from factory.planning.budget import requested_budget
from factory.store import file_key, open_existing_store
from factory.wheels.compare import compare_wheels
from factory.wheels.provenance import sha256_file


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", metavar="CELL", help="a published cell id")
    add_matrix_arg(parser)
    add_store_arg(parser)
    add_runner_arg(parser)
    parser.add_argument("--memory", default=None, help="memory cap for the build, e.g. 16g")
    parser.add_argument("--cpus", type=int, default=None, help="CPUs for the build")
    parser.add_argument("--keep", action="store_true", help="keep the rebuild's tree and wheel")


def run(args: argparse.Namespace) -> int:
    matrix = matrix_from_args(args)
    pc = matrix.find(args.cell, outside=True)
    store = open_existing_store(store_from_args(args))
    published = store.read(file_key(pc.cell.package, pc.wheel))
    if published is None:
        raise CellError(
            f"{pc.wheel} is not published in {store.url}",
            tip="'factory build CELL --publish' builds and publishes it",
        )
    # A tree of its own beside the work dir (so the toolkits next to it are shared): the cell's
    # own tree may hold objects from an earlier build, and a rebuild must compile everything.
    work = matrix.settings.work_dir.parent / "rebuild-check"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        fresh = dataclasses.replace(
            matrix, settings=dataclasses.replace(matrix.settings, work_dir=work)
        )
        opts = BuildOptions(
            runner=args.runner or matrix.settings.runner,
            budget=requested_budget(matrix.settings, memory=args.memory, cpus=args.cpus),
            out_dir=work / "out",
            force=True,
            verify_import=False,
            verbose=args.verbose,
        )
        outcome = build_cell(fresh, pc, opts, Log())
        assert outcome.wheel is not None
        first = work / "published" / pc.wheel
        first.parent.mkdir()
        first.write_bytes(published)
        diffs = compare_wheels(first, outcome.wheel)
        rebuilt_sha = sha256_file(outcome.wheel)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if not diffs:
        print(
            f"identical: {pc.wheel} rebuilt from source has the published bytes "
            f"(sha256 {rebuilt_sha})"
        )
        return 0
    for d in diffs:
        print(f"differs  {d.name}: {d.why}")
    raise VerifyError(
        f"{pc.wheel}: the rebuild differs from the published wheel in {len(diffs)} member(s)",
        tip="the lines above name each member and why; --keep keeps both wheels to inspect",
    )
