"""factory publish [--store STORE] [--max-unpacked SIZE] [--max-ratio N] WHEEL..."""

from __future__ import annotations

import argparse
from pathlib import Path

from factory.commands._common import (
    add_store_arg,
    add_wheel_limit_args,
    print_json,
    store_from_args,
    wheel_limits_from_args,
)
from factory.index.publish import publish
from factory.store import open_store


def configure(parser: argparse.ArgumentParser) -> None:
    add_store_arg(parser)
    parser.add_argument(
        "wheels",
        nargs="+",
        type=Path,
        metavar="WHEEL",
        help="wheel files; a WHEEL.provenance.json next to one is uploaded with it",
    )
    add_wheel_limit_args(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    store = open_store(store_from_args(args))
    report = publish(store, args.wheels, limits=wheel_limits_from_args(args))
    if args.json:
        print_json(
            {
                "store": store.url,
                "published": list(report.published),
                "unchanged": list(report.unchanged),
                "pages_changed": report.pages_changed,
            }
        )
        return 0
    for name in report.published:
        print(f"published {name}")
    for name in report.unchanged:
        print(f"unchanged {name} (same bytes already published)")
    print(
        f"{store.url}: {len(report.published)} new, {len(report.unchanged)} unchanged, "
        f"{report.pages_changed} page(s) rewritten"
    )
    return 0
