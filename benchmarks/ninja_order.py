"""Which order does a given ninja start a flat build's compiles in, and does our fix change it?

A synthetic build.ninja of `sleep` edges shaped like flash-attn's (many short objects, one
long one named last alphabetically, as setuptools sorts them), run at -j2 three ways:
  alphabetical            what torch writes today
  alphabetical + seeded   with a .ninja_log from an earlier run (only a ninja that weighs
                          edges by logged duration, ninja PR #2686, would start z_long first)
  reordered               build.ninja rewritten by factory.planning.critical_path.reorder_build_ninja

    python benchmarks/ninja_order.py [NINJA ...]      (default: `ninja` on PATH)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.planning.critical_path import reorder_build_ninja  # noqa: E402

SECONDS = {**{f"k{i}": 0.25 for i in range(8)}, "z_long": 2.0}
RULE = "rule cuda_compile\n  command = sleep $$(cat $in) && touch $out\n"


def build_ninja() -> str:
    return RULE + "".join(f"build obj/{k}.o: cuda_compile src/{k}.cu\n" for k in sorted(SECONDS))


def seeded_log() -> str:
    # ninja log v5 lines: start end mtime output hash (the hash only matters for dirtiness).
    return "# ninja log v5\n" + "".join(
        f"0\t{int(s * 1000)}\t0\tobj/{k}.o\t0\n" for k, s in SECONDS.items()
    )


def run(ninja: str, text: str, log: str | None) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "src").mkdir()
        for k, s in SECONDS.items():
            (root / "src" / f"{k}.cu").write_text(str(s))
        (root / "build.ninja").write_text(text)
        if log:
            (root / ".ninja_log").write_text(log)
        t0 = time.monotonic()
        subprocess.run([ninja, "-j2"], cwd=root, check=True, capture_output=True)
        wall = time.monotonic() - t0
        starts = {}
        for line in (root / ".ninja_log").read_text().splitlines():
            if line.startswith("#"):
                continue
            f = line.split("\t")
            starts[Path(f[3]).stem] = int(f[0]) / 1000  # ninja appends: the last entry wins
        return wall, starts.get("z_long", float("nan"))


def main(argv: list[str]) -> int:
    priorities = {f"src/{k}": s for k, s in SECONDS.items()}
    for ninja in argv or ["ninja"]:
        version = subprocess.run([ninja, "--version"], capture_output=True, text=True).stdout
        print(f"ninja {version.strip()} ({ninja})")
        for label, text, log in (
            ("alphabetical", build_ninja(), None),
            ("alphabetical + seeded .ninja_log", build_ninja(), seeded_log()),
            ("reordered longest-first", reorder_build_ninja(build_ninja(), priorities), None),
        ):
            wall, z = run(ninja, text, log)
            print(f"  {label:34s} wall {wall:5.2f} s   z_long (2 s) starts at {z:4.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
