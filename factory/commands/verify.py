"""factory verify WHEEL... [--no-import] [--wheelhouse DIR] [--json] [--matrix PATH]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from factory.commands._common import print_json
from factory.errors import ConfigError, FactoryError, VerifyError
from factory.matrix.load import Matrix, PlannedCell, load_matrix
from factory.matrix.paths import default_matrix_path
from factory.matrix.tags import platform_of_plat
from factory.toolchain.wheelhouse import wheelhouse_dir
from factory.wheels.reader import require_file
from factory.wheels.report import WheelReport
from factory.wheels.verify import verify_wheel


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "wheels", nargs="+", type=Path, metavar="WHEEL", help="wheel files to check"
    )
    parser.add_argument(
        "--no-import", action="store_true", help="skip the clean-venv install and import"
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        default=None,
        help="where pip finds torch and the other dependencies, offline "
        "(default: the matrix's settings.wheelhouse/<cp tag>)",
    )
    parser.add_argument("--allow-ptx", action="store_true", help="accept PTX next to the SASS")
    parser.add_argument(
        "--matrix",
        type=Path,
        default=None,
        help="matrix file: a wheel it plans is checked against its cell",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _matrix(args: argparse.Namespace) -> Matrix | None:
    """The matrix, when there is one: it turns a filename into the planned cell."""
    if args.matrix is not None:
        return load_matrix(args.matrix)  # asked for explicitly: its errors are the user's
    path = default_matrix_path()
    if path is None or not path.exists():
        return None
    try:
        return load_matrix(path)
    except ConfigError:
        return None


def _wheelhouse(args: argparse.Namespace, matrix: Matrix | None, wheel: Path) -> Path | None:
    if args.wheelhouse is not None:
        return Path(args.wheelhouse)
    if matrix is None:
        return None
    base = matrix.settings.wheelhouse
    parts = wheel.name.removesuffix(".whl").split("-")
    if len(parts) < 5:
        return None  # not a wheel name: verify says so
    cp = parts[-3]  # the python tag: cp311
    try:
        cpu = platform_of_plat(parts[-1].split(".")[0])
    except FactoryError:
        return None
    found = wheelhouse_dir(base, cp, cpu)
    return found if found.is_dir() else None


def run(args: argparse.Namespace) -> int:
    matrix = _matrix(args)
    planned: dict[str, PlannedCell] = {pc.wheel: pc for pc in matrix.cells} if matrix else {}
    reports: list[WheelReport] = []
    echo = (lambda line: print(f"    {line}", file=sys.stderr)) if args.verbose else None
    for wheel in args.wheels:
        require_file(wheel)  # a missing file is one line, before any check runs
    for wheel in args.wheels:
        if not args.json:
            print(f"verify {wheel.name}", flush=True)
        report = verify_wheel(
            wheel,
            expected=planned.get(wheel.name),
            import_check=not args.no_import,
            wheelhouse=_wheelhouse(args, matrix, wheel),
            raise_on_failure=False,
            allow_ptx=args.allow_ptx,
            echo=echo,
            sysroots=matrix.settings.sysroots_dir if matrix else None,
        )
        reports.append(report)
        if not args.json:
            for c in report.checks:
                print(f"    {c.status:4}  {c.name:9}  {c.detail}", flush=True)
    if args.json:
        print_json({"wheels": [r.as_dict() for r in reports]})
    failed = [r for r in reports if not r.ok]
    if failed:
        raise VerifyError(
            f"{len(failed)} of {len(reports)} wheel(s) failed verification: {failed[0].summary()}"
        )
    if not args.json:
        print(f"{len(reports)} wheel(s) verified")
    return 0
