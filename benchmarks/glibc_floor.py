"""The glibc floor of wheels or shared objects, as a table (docs/GLIBC.md, docs/BENCHMARKS.md).

    python benchmarks/glibc_floor.py dist/*.whl build/lib*/pkg/_C*.so

Per file: the lowest manylinux policy its binaries fit (auditwheel's policy data), the highest
GLIBC / GLIBCXX / CXXABI versions they need, and the symbol version that sets the floor.
"""

from __future__ import annotations

import sys
from pathlib import Path

from factory.wheels.floor import BinaryFloor, files_floor, wheel_floor


def floor_of(path: Path) -> BinaryFloor:
    return wheel_floor(path) if path.suffix == ".whl" else files_floor([path])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = [("file", "floor", "GLIBC", "GLIBCXX", "CXXABI", "set by")]
    for arg in argv:
        f = floor_of(Path(arg))
        first = f.set_by[0] if f.set_by else None
        rows.append((
            Path(arg).name, f.policy, f.highest.get("GLIBC", "-"), f.highest.get("GLIBCXX", "-"),
            f.highest.get("CXXABI", "-"),
            f"{first.version} {', '.join(first.symbols[:2])}" if first else "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
