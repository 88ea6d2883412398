"""Arguments several subcommands share, and JSON output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from factory.environment import MATRIX_ENV, STORE_ENV, env_value
from factory.errors import UsageError
from factory.matrix.load import Matrix, load_matrix
from factory.matrix.paths import default_matrix_path, matrix_path
from factory.matrix.settings import DEFAULT_STORE, default_settings
from factory.runners import RUNNERS, runner_help
from factory.store import URL_FORMS
from factory.units import parse_size
from factory.wheels.checks import DEFAULT_LIMITS


def add_matrix_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--matrix", type=Path, default=None,
        help=f"matrix file (default: ${MATRIX_ENV}, else ./matrix.toml)",
    )


def add_runner_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", choices=tuple(RUNNERS), default=None, help=runner_help())


def add_store_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=None,
        help=f"a directory or {URL_FORMS} (default: ${STORE_ENV}, else the matrix's "
        f"settings.store, else {DEFAULT_STORE})",
    )


def add_cert_arg(parser: argparse.ArgumentParser, *, verifies: bool) -> None:
    """--cert FILE: the CA bundle of an https index a private CA signed, which the printed
    install lines pass to the installers (the doctor also verifies the index with it)."""
    what = "verifies" if verifies else "hosts verify"
    parser.add_argument("--cert", type=Path, default=None, metavar="FILE",
                        help=f"the CA bundle that {what} an https index whose certificate a "
                             "private CA signed; the printed lines pass it to the installers")


def matrix_from_args(args: argparse.Namespace) -> Matrix:
    """The matrix: its lock's cells while the lock matches it; a stale lock is said once."""
    matrix = load_matrix(matrix_path(args.matrix))
    if matrix.lock_state == "stale" and not getattr(args, "_warned_stale", False):
        args._warned_stale = True
        print(f"WARNING {matrix.lock_file} is out of date with {matrix.path} (its rules "
              f"changed): the cells are resolved against {matrix.facts.describe()}; "
              "'factory lock' writes the lock again", file=sys.stderr)
    return matrix


def store_from_args(args: argparse.Namespace) -> str:
    """--store, else $FACTORY_STORE, else the matrix's store setting, else the default store
    (under the current directory): ``Settings`` applies the environment over the matrix. A
    matrix that does not load is an error, not a reason to publish somewhere else."""
    if getattr(args, "store", None):
        return str(args.store)
    if env_value(STORE_ENV):  # the environment outranks the matrix: no need to read it
        return default_settings().store
    path = getattr(args, "matrix", None) or default_matrix_path()
    if path is None or not path.exists():
        return default_settings().store
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
    limits = DEFAULT_LIMITS
    if args.max_unpacked is not None:
        size = parse_size(args.max_unpacked, what="--max-unpacked")
        limits = dataclasses.replace(limits, max_unpacked=size)
    if args.max_ratio is not None:
        if not args.max_ratio >= 1:
            raise UsageError(f"--max-ratio must be at least 1, not {args.max_ratio}")
        limits = dataclasses.replace(limits, max_ratio=args.max_ratio)
    return limits


# One metavar per kind of value, the same for an option in every command that takes it (a
# size is SIZE whether it caps a build's memory or an upload). ``apply_metavars`` gives them to
# the options that name none; tests/unit/test_cli.py holds every option to this table.
METAVARS = {
    "--matrix": "FILE", "--builders": "FILE", "--html": "FILE", "--htpasswd": "FILE",
    "--history": "FILE", "--nvidia-smi-output": "FILE", "--tarball": "FILE",
    "--tls-cert": "FILE", "--tls-key": "FILE", "--cert": "FILE",
    "--out": "DIR", "--work-dir": "DIR", "--root": "DIR", "--wheelhouse": "DIR",
    "--store": "STORE", "--package": "NAME", "--suite": "NAME", "--name": "IMAGE",
    "--base": "IMAGE", "--memory": "SIZE", "--max-unpacked": "SIZE", "--max-upload": "SIZE",
    "--cpus": "N", "--max-jobs": "N", "--nvcc-threads": "N", "--attempts": "N", "--keep": "N",
    "--max-connections": "N", "--workers": "N", "--max-ratio": "N", "--temp-grace": "SECONDS",
    "--torch": "VERSION", "--cuda": "VERSION", "--python": "VERSION", "--arch": "ARCH",
    "--platform": "CPU", "--machine": "CPU", "--index": "URL", "--index-url": "URL",
    "--host": "HOST", "--port": "PORT", "--reason": "TEXT", "--interpreter": "EXE",
    "--from": "DIR|URL", "--timeout": "SECONDS", "--replay": "DIR", "--record": "DIR",
    "--lease-ttl": "SECONDS", "--poll": "SECONDS", "--log-dir": "DIR", "--chdir": "DIR",
    "--workdir": "DIR", "--secret": "NAME", "--factory": "CMD", "--job-matrix": "FILE",
    "--build-arg": "TEXT", "--sbatch-option": "TEXT", "--partition": "NAME", "--account": "NAME",
    "--image": "IMAGE", "--namespace": "NAME",
}
# where one option name takes another kind of value in one command
METAVAR_EXCEPTIONS = {("doctor", "--python"): "EXE", ("facts", "--out"): "FILE"}
POSITIONAL_METAVARS = {"cells": "CELL", "cell": "CELL", "wheels": "WHEEL", "spec": "SPEC",
                       "filename": "FILENAME", "target": "WHEEL|CELL", "cuda": "VERSION"}


def metavar_for(command: str, action: argparse.Action) -> str | None:
    """The table's metavar for an option (or positional) of ``command``; None: not listed."""
    if not action.option_strings:
        return POSITIONAL_METAVARS.get(action.dest)
    long = next((o for o in action.option_strings if o.startswith("--")), "")
    return METAVAR_EXCEPTIONS.get((command, long), METAVARS.get(long))


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and action.choices is None and not isinstance(
        action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))


def apply_metavars(parser: argparse.ArgumentParser, command: str = "") -> None:
    """Give every option that takes a value and names no metavar the table's; an option with
    choices too where the table names its kind (``request --platform CPU``, as ``work`` and
    ``image sysroot`` say it), else argparse's ``{a,b}``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, nested in action.choices.items():
                apply_metavars(nested, command or name)
            continue
        named_choices = action.choices is not None and bool(action.option_strings)
        if action.metavar is None and (takes_value(action) or named_choices):
            action.metavar = metavar_for(command, action)
