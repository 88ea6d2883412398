"""factory facts [show|refresh|snapshot] : what the indexes say about torch and the packages.

- ``show`` (the default): the facts this builder has, where each came from and how old it is.
- ``refresh``: read the indexes again for the matrix (what ``factory lock`` does first).
- ``snapshot --replay DIR | --record DIR [--out PATH]``: make the shipped snapshot from the
  responses recorded in DIR (``--record`` asks the indexes first and re-records DIR).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from packaging.version import Version

from factory.commands._common import add_matrix_arg, matrix_from_args, print_json
from factory.errors import UsageError
from factory.matrix.load import load_matrix
from factory.matrix.paths import matrix_path
from factory.matrix.refresh import read_indexes
from factory.upstream.facts import SNAPSHOT, Facts, age
from factory.upstream.snapshot import make_snapshot

SHIPPED = Path(__file__).resolve().parents[1] / "data" / SNAPSHOT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("show", "refresh", "snapshot"),
                        default="show",
                        help="show the facts at hand (default), refresh them from the indexes, "
                        "or remake the shipped snapshot")
    add_matrix_arg(parser)
    parser.add_argument("--torch", action="append", default=None, metavar="VERSION",
                        help="show: only these torch minors (e.g. 2.14)")
    parser.add_argument("--replay", type=Path, default=None, metavar="DIR",
                        help="snapshot: from the responses recorded in DIR only")
    parser.add_argument("--record", type=Path, default=None, metavar="DIR",
                        help="snapshot: ask the indexes, re-record DIR, then make the snapshot")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help=f"snapshot: where to write it (default: the shipped {SNAPSHOT})")
    parser.add_argument("--json", action="store_true", help="show: machine-readable output")


def run(args: argparse.Namespace) -> int:
    if args.action == "snapshot":
        return _snapshot(args)
    matrix = matrix_from_args(args) if args.action == "show" else None
    if args.action == "refresh":
        shell = load_matrix(matrix_path(args.matrix), use_lock=False, expand=False)
        facts = read_indexes(shell)
    else:
        assert matrix is not None
        facts = matrix.facts
    if args.json:
        print_json({"kind": facts.kind, "path": facts.path, **facts.as_json(),
                    "version": 1})
        return 0
    for line in describe(facts, minors=args.torch):
        print(line)
    return 0


def describe(facts: Facts, *, minors: list[str] | None = None) -> list[str]:
    where = f" ({facts.path})" if facts.path else ""
    lines = [f"facts: {facts.describe()}{where}, {age(facts.generated)} old"]
    lines += [f"note: {n}" for n in facts.notes]
    for version in sorted(facts.torch_versions(), reverse=True):
        v = str(version)
        if minors and f"{version.major}.{version.minor}" not in minors:
            continue
        release = facts.torch[v]
        cpus = "; ".join(f"{cpu} {', '.join(py)}" for cpu, py in release.wheels.items())
        published = f", published {release.published}" if release.published else ""
        lines.append(f"torch {v}{published}: CPython {cpus}")
        lines.append(f"    from {release.origin.describe()}")
        for b in facts.builds_of(v):
            where_from = "PyPI" if b.on_pypi else b.index
            pin = f" ({b.origin.note})" if b.on_pypi and b.origin.note else ""
            lines.append(f"  CUDA {b.cuda} on {where_from}{pin}: {', '.join(sorted(b.files))}")
            lines.append(f"    from {b.origin.describe()}")
    for name, releases in sorted(facts.packages.items()):
        if not releases:
            continue
        newest = max(releases, key=Version)
        origin = releases[newest].origin
        lines.append(f"{name}: {len(releases)} release(s), newest {newest}")
        lines.append(f"    from {origin.describe()}")
    return lines


def _snapshot(args: argparse.Namespace) -> int:
    if (args.replay is None) == (args.record is None):
        raise UsageError("snapshot needs --replay DIR or --record DIR (one of them)")
    directory = args.replay or args.record
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory of recorded responses")
    facts = make_snapshot(directory, live=args.record is not None)
    out: Path = args.out or SHIPPED
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(facts.dumps())
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    print(f"wrote {out}: {len(facts.torch)} torch release(s), {len(facts.builds)} build(s), "
          f"{sum(len(r) for r in facts.packages.values())} package release(s); facts of "
          f"{facts.generated}")
    for note in facts.notes:
        print(f"note: {note}")
    return 0
