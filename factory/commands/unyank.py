"""factory unyank [--store STORE] FILENAME"""

from __future__ import annotations

import argparse

from factory.commands._common import add_store_arg, store_from_args
from factory.index.publish import unyank
from factory.store import open_existing_store


def configure(parser: argparse.ArgumentParser) -> None:
    add_store_arg(parser)
    parser.add_argument("filename", metavar="FILENAME", help="the yanked wheel's file name")


def run(args: argparse.Namespace) -> int:
    store = open_existing_store(store_from_args(args))
    if unyank(store, args.filename):
        print(f"unyanked {args.filename}")
    else:
        print(f"{args.filename} was not yanked")
    return 0
