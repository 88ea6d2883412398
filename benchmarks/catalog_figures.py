"""The figures of catalog builds, one markdown row per wheel, from what the build left behind.

For each ``<wheel>.provenance.json`` given: the wheel's size, the last attempt's build report
(``<log>.report.json``: objects, peak compiler RSS summed over concurrent jobs, the cgroup's
peak anonymous memory) and the compiler wrappers' record (``compilers``: the archs the package
asked nvcc for and the ones it compiled), and the compile span from the ninja log(s) in the
cell's build tree (first start to last end; a package with several extensions runs ninja once
per extension, and the log keeps no border between runs: no span is given then).

    python benchmarks/catalog_figures.py DIST/*.provenance.json [--work-dir WORK]

Measured, not modelled: every number is read from the build's own files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

GIB = 1024**3
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] ")


def ninja_runs(build_log: Path) -> list[int]:
    """The objects of each ninja run in a build log ('[1/4] ...' starts a run): a package with
    several extensions runs ninja once per extension."""
    runs: list[int] = []
    for line in build_log.read_text(errors="replace").splitlines():
        m = PROGRESS.match(line)
        if m:
            done, total = int(m.group(1)), int(m.group(2))
            if done == 1 or not runs:
                runs.append(total)
    return runs


def ninja_span(tree: Path, cell: str) -> float | None:
    """Seconds from the first start to the last end in the build tree's .ninja_log (one run)."""
    entries = []
    for log in [*tree.rglob(".ninja_log"), *tree.glob(f"{cell}.ninja_log")]:
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
                entries.append((int(parts[0]), int(parts[1])))
    if not entries:
        return None
    return round((max(e for _, e in entries) - min(s for s, _ in entries)) / 1000, 1)


def row(provenance: Path, work_dir: Path | None, wheel_size: int | None = None) -> dict[str, Any]:
    """One wheel's figures. Its files are where the build left them, or, for results copied
    off a machine (benchmarks/gpu/*/collect), beside the provenance as ``<cell>.<name>``."""
    doc = json.loads(provenance.read_text())
    wheel = provenance.with_name(doc["wheel"])
    last = doc["attempts"][-1]
    cell = doc["cell"]["id"]
    log = Path(last["log"])
    if not log.is_file():
        log = provenance.with_name(f"{cell}.{log.name}")
    report_path = Path(str(log) + ".report.json")
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    compilers = report.get("compilers") or {}
    runs = ninja_runs(log) if log.is_file() else []
    tree = (work_dir or Path(last["log"]).parents[2]) / cell / "src"
    if not tree.is_dir():
        tree = provenance.parent  # the copied <cell>.ninja_log
    # one ninja run (or a log cut before its first line): its span; several (one per
    # extension): the .ninja_log keeps no border between runs
    span = ninja_span(tree, cell) if len(runs) <= 1 else None
    anon = report.get("cgroup_anon_peak_bytes")
    return {
        "wheel": doc["wheel"],
        "objects": sum(runs) or last.get("objects_total"),
        "ninja_runs": len(runs),
        "compile_span_s": span,
        "build_s": last.get("wall_seconds"),
        "max_jobs": last.get("max_jobs"),
        "peak_compile_rss_gib": round((last.get("compile_peak_rss_bytes") or 0) / GIB, 2),
        "peak_anon_gib": round(anon / GIB, 2) if anon else None,
        "wheel_mb": (round(wheel.stat().st_size / 1e6, 2) if wheel.is_file()
                     else round(wheel_size / 1e6, 2) if wheel_size else None),
        "asked_archs": compilers.get("asked_archs"),
        "compiled_archs": compilers.get("compiled_archs"),
        "narrowed_calls": compilers.get("narrowed"),
        "std_raised_calls": compilers.get("std_raised"),
    }


def _listed_sizes(listing: Path) -> dict[str, int]:
    out = {}
    for line in listing.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 9 and parts[-1].endswith(".whl") and parts[4].isdigit():
            out[parts[-1]] = int(parts[4])
    return out


def _archs(values: list[int] | None) -> str:
    return ", ".join(f"sm_{a}" for a in values) if values else "-"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("provenance", nargs="+", type=Path)
    parser.add_argument("--work-dir", type=Path,
                        help="the matrix's work-dir (default: from the log)")
    parser.add_argument("--sizes", type=Path,
                        help="an 'ls -l' listing of the wheels, for results without them")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = _listed_sizes(args.sizes) if args.sizes else {}
    rows = [row(p, args.work_dir, sizes.get(json.loads(p.read_text())["wheel"]))
            for p in args.provenance]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print("| wheel | objects | compile span | build (attempt) | MAX_JOBS | peak compile RSS "
          "| peak anon (cgroup) | wheel | archs asked -> compiled (calls narrowed) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        asked = r["asked_archs"]
        narrowing = (f"{len(asked)} ({_archs(asked)}) -> {_archs(r['compiled_archs'])} "
                     f"({r['narrowed_calls']})" if asked else
                     "nothing to narrow: it asked for the cell's archs")
        if r["std_raised_calls"]:
            narrowing += f"; a pinned -std raised to C++20 in {r['std_raised_calls']} call(s)"
        span = (f"{r['compile_span_s']} s" if r["compile_span_s"] is not None
                else f"- ({r['ninja_runs']} ninja runs)")
        print(f"| `{r['wheel']}` | {r['objects']} | {span} | {r['build_s']} s "
              f"| {r['max_jobs']} | {r['peak_compile_rss_gib']} GiB | {r['peak_anon_gib']} GiB "
              f"| {r['wheel_mb']} MB | {narrowing} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
