"""Arguments several subcommands share, and JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from factory.errors import UsageError
from factory.matrix.load import Matrix, default_matrix_path, load_matrix
from factory.matrix.settings import DEFAULT_STORE
from factory.store import URL_FORMS
from factory.units import parse_size
from factory.wheels.checks import DEFAULT_LIMITS


def add_matrix_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=None, help="matrix file (default: ./matrix.toml)")


def add_store_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=None,
        help=f"a directory or {URL_FORMS} "
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


def add_wheel_limit_args(parser: argparse.ArgumentParser) -> None:
    """The caps of the strict wheel checks (factory.wheels.checks), for publish and serve."""
    parser.add_argument(
        "--max-unpacked",
        default=None,
        metavar="SIZE",
        help="refuse a wheel that unpacks to more than this (default 16g)",
    )
    parser.add_argument(
        "--max-ratio",
        type=float,
        default=None,
        metavar="N",
        help="refuse a wheel (over 256 MiB unpacked) that unpacks to more than N times its "
        "compressed size (default 100)",
    )


def wheel_limits_from_args(args: argparse.Namespace) -> Any:
    import dataclasses

    limits = DEFAULT_LIMITS
    if args.max_unpacked is not None:
        size = parse_size(args.max_unpacked, what="--max-unpacked")
        limits = dataclasses.replace(limits, max_unpacked=size)
    if args.max_ratio is not None:
        if not args.max_ratio >= 1:
            raise UsageError(f"--max-ratio must be at least 1, not {args.max_ratio}")
        limits = dataclasses.replace(limits, max_ratio=args.max_ratio)
    return limits
