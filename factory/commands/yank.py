"""factory yank [--store STORE] FILENAME --reason TEXT"""

from __future__ import annotations

import argparse

from factory.commands._common import add_store_arg, store_from_args
from factory.index.publish import yank
from factory.store import open_existing_store


def configure(parser: argparse.ArgumentParser) -> None:
    add_store_arg(parser)
    parser.add_argument("filename", metavar="FILENAME", help="the published wheel's file name")
    parser.add_argument("--reason", required=True, help="shown to users by pip (PEP 592)")


def run(args: argparse.Namespace) -> int:
    store = open_existing_store(store_from_args(args))
    if yank(store, args.filename, args.reason):
        print(f"yanked {args.filename}: {args.reason}")
    else:
        print(f"{args.filename} was already yanked")
    return 0
