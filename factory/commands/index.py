"""factory index rebuild|verify|wheel-variants [--store STORE]"""

from __future__ import annotations

import argparse

from factory.commands._common import add_store_arg, print_json, store_from_args
from factory.errors import IndexError_, UsageError
from factory.index import rebuild_index, verify_index
from factory.index.publish import TEMP_GRACE
from factory.index.wheel_variants import write_wheel_variants
from factory.store import open_existing_store


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["rebuild", "verify", "wheel-variants"],
        help="rebuild: regenerate every page from the store; verify: check every link and hash; "
        "wheel-variants: add the variant-labelled copies (PEP 825) under wheel-variants/",
    )
    add_store_arg(parser)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="verify: trust the recorded sha256 of each wheel instead of re-hashing it",
    )
    parser.add_argument(
        "--temp-grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="rebuild: remove writers' temp files older than this (default 3600)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    store = open_existing_store(store_from_args(args))
    if args.action == "wheel-variants":
        written = write_wheel_variants(store, store.wheels())
        print(f"wheel variants: {written} files written under {store.url}/wheel-variants/")
        return 0
    if args.action == "rebuild":
        grace = TEMP_GRACE if args.temp_grace is None else args.temp_grace
        if grace < 0:
            raise UsageError(f"--temp-grace must be >= 0, not {args.temp_grace}")
        r = rebuild_index(store, temp_grace=grace)
        if args.json:
            print_json(
                {
                    "store": store.url,
                    "wheels": r.wheels,
                    "projects": r.projects,
                    "variants": r.variants,
                    "pages_written": r.pages_written,
                    "pages_unchanged": r.pages_unchanged,
                    "pages_removed": r.pages_removed,
                    "completed": list(r.completed),
                    "temps_removed": list(r.temps_removed),
                    "seconds": round(r.seconds, 3),
                }
            )
            return 0
        for name in r.completed:
            print(f"completed an interrupted publish: {name}")
        for key in r.temps_removed:
            print(f"removed a stale temp file: {key}")
        print(
            f"{store.url}: {r.wheels} wheel(s), {r.projects} project(s), {r.variants} variant(s); "
            f"{r.pages_written} page(s) written, {r.pages_unchanged} unchanged, "
            f"{r.pages_removed} removed in {r.seconds:.2f} s"
        )
        return 0
    v = verify_index(store, deep=not args.quick)
    if args.json:
        print_json(
            {
                "store": store.url,
                "ok": v.ok,
                "wheels": v.wheels,
                "pages": v.pages,
                "links": v.links,
                "problems": list(v.problems),
                "pending": list(v.pending),
                "floors": list(v.floors),
                "temps": list(v.temps),
                "orphans": list(v.orphans),
            }
        )
    else:
        for name in v.pending:
            print(
                f"pending {name}: uploaded but not committed ('factory index rebuild' completes it)"
            )
        for floor in v.floors:
            print(f"floor   {floor['wheel']}: {floor.get('policy') or 'unreadable'}")
        for temp in v.temps:
            print(f"temp {temp}: a writer's temp file ('index rebuild' removes it when stale)")
        for key in v.orphans:
            print(f"orphan  {key}: its wheel is gone (a deletion stopped); harmless, remove it")
        for problem in v.problems:
            print(f"problem {problem}")
        print(
            f"{store.url}: {v.wheels} wheel(s), {v.pages} page(s), {v.links} link(s) checked, "
            f"{len(v.problems)} problem(s)"
        )
    if not v.ok:
        raise IndexError_(
            f"{len(v.problems)} problem(s) in the index of {store.url}",
            tip="'factory index rebuild' regenerates the pages from the store",
        )
    return 0
