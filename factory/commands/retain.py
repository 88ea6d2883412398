"""factory retain [--store STORE] --keep N [--force] [--dry-run] [--json]"""

from __future__ import annotations

import argparse

from factory.commands._common import add_store_arg, print_json, store_from_args
from factory.index.retention import DELETE, KEEP, YANK, retain
from factory.store import open_existing_store


def configure(parser: argparse.ArgumentParser) -> None:
    add_store_arg(parser)
    parser.add_argument("--keep", type=int, required=True, metavar="N",
                        help="builds to keep per cell, newest by the manifest's 'created'")
    parser.add_argument("--force", action="store_true",
                        help="delete the older builds instead of yanking them "
                        "(breaks pins to them)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would change, change nothing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    store = open_existing_store(store_from_args(args))
    actions, counts = retain(store, keep=args.keep, force=args.force, dry_run=args.dry_run)
    if args.json:
        print_json({"store": store.url, "dry_run": args.dry_run,
                    "actions": [a.as_dict() for a in actions], "counts": counts})
        return 0
    for a in actions:
        if a.action != KEEP:
            verb = "would " if args.dry_run and a.action in (YANK, DELETE) else ""
            print(f"{verb}{a.action:14} {a.wheel} ({a.cell_id}, created {a.created}): {a.reason}")
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no builds"
    print(f"{store.url}: {summary}{' (dry run: nothing changed)' if args.dry_run else ''}")
    return 0
