"""Arguments several subcommands share, and JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from factory.matrix.load import Matrix, default_matrix_path, load_matrix
from factory.matrix.settings import DEFAULT_STORE


def add_matrix_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=None, help="matrix file (default: ./matrix.toml)")


def add_store_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=None,
        help="a directory or s3://bucket/prefix "
        f"(default: the matrix's settings.store, {DEFAULT_STORE})",
    )


def matrix_from_args(args: argparse.Namespace) -> Matrix:
    return load_matrix(args.matrix or default_matrix_path())


def store_from_args(args: argparse.Namespace) -> str:
    """--store, else the matrix's store setting; without a matrix file, the default store (under
    the current directory). A matrix that does not load is an error, not a reason to publish
    somewhere else."""
    if getattr(args, "store", None):
        return str(args.store)
    path = getattr(args, "matrix", None) or default_matrix_path()
    if not path.exists():
        return DEFAULT_STORE
    return load_matrix(path).settings.store


def print_json(obj: dict[str, Any]) -> None:
    json.dump({"version": 1, **obj}, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
