"""Arguments several subcommands share, and JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from factory.matrix.load import Matrix, default_matrix_path, load_matrix


def add_matrix_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=None, help="matrix file (default: ./matrix.toml)")


def add_store_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=None,
        help="a directory or s3://bucket/prefix (default: the matrix's settings.store, index/store)",
    )


def matrix_from_args(args: argparse.Namespace) -> Matrix:
    return load_matrix(args.matrix or default_matrix_path())


def store_from_args(args: argparse.Namespace) -> str:
    if getattr(args, "store", None):
        return str(args.store)
    try:
        m = matrix_from_args(args) if hasattr(args, "matrix") else load_matrix(default_matrix_path())
        store = str(m.settings["store"])
        if "://" not in store and not Path(store).is_absolute():
            store = str(m.root / store)
        return store
    except Exception:
        return "index/store"


def print_json(obj: dict[str, Any]) -> None:
    json.dump({"version": 1, **obj}, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
