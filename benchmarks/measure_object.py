"""Peak memory and time of compiling single objects of a cell, alone, in its build container.

The planner's per-job peak is what a whole build averages to; a few objects are much heavier
(flash-attn's backward hdim256 kernels). This compiles the named objects one at a time with the
exact command of the cell's build.ninja, in the cell's builder image with its venv and toolkit,
network off, and prints the largest resident set of the compile's processes (cicc and ptxas
dominate) and the seconds.

Needs a build tree: run ``factory build CELL`` first (it may stop early; build.ninja is written
before the first compile).

    python benchmarks/measure_object.py flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311 \\
        flash_bwd_hdim256_fp16_sm80 flash_fwd_hdim128_bf16_sm80
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.build.pipeline import build_image, cell_venv, cell_work_dir, toolkits_dir  # noqa: E402
from factory.matrix.load import load_matrix  # noqa: E402
from factory.runners.base import INSIDE  # noqa: E402
from factory.toolchain.toolkit import materialize_cuda_home  # noqa: E402

PROBE = """
import json, resource, subprocess, sys, time
t0 = time.monotonic()
proc = subprocess.run(sys.argv[1], shell=True, capture_output=True, text=True)
print(json.dumps({"rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
                  "max_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "tail": proc.stderr[-400:] if proc.returncode else ""}))
"""


def command_for(build_dir: Path, name: str) -> str:
    """The object's compile command from build.ninja, writing to /tmp instead of the tree."""
    (target,) = [
        line.split(":", 1)[0][len("build "):]
        for line in (build_dir / "build.ninja").read_text().splitlines()
        if line.startswith("build ") and line.split(":", 1)[0].endswith(f"/{name}.o")
    ]
    cmd = subprocess.run(["ninja", "-C", str(build_dir), "-t", "commands", target],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    cmd = cmd.replace(f"-o {target}", "-o /tmp/probe.o")
    return re.sub(r"-MF \S+", "-MF /tmp/probe.o.d", cmd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cell")
    ap.add_argument("objects", nargs="+", help="object names without .o (e.g. flash_bwd_hdim256_fp16_sm80)")
    ap.add_argument("--matrix", type=Path, default=REPO / "matrix.toml")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    matrix = load_matrix(args.matrix)
    (pc,) = [c for c in matrix.cells if c.cell.id == args.cell]
    src = cell_work_dir(matrix, pc) / "src"
    (build_dir,) = sorted((src / "build").glob("temp.*"))
    image = build_image(matrix, pc)
    venv = cell_venv(matrix, pc, "docker")
    cuda = materialize_cuda_home(pc.toolchain, toolkits_dir(matrix))
    rows = []
    for name in args.objects:
        cmd = command_for(build_dir, name)
        out = subprocess.run(
            ["docker", "run", "--rm", "--network", "none",
             "-v", f"{src.resolve()}:{INSIDE['src']}:ro",
             "-v", f"{venv.resolve()}:{INSIDE['venv']}:ro",
             "-v", f"{Path(cuda).resolve()}:{INSIDE['cuda']}:ro",
             image, f"{INSIDE['venv']}/bin/python", "-c", PROBE, cmd],
            capture_output=True, text=True, check=True,
        ).stdout
        rows.append({"object": name, **json.loads(out)})
    if args.json:
        print(json.dumps({"cell": args.cell, "objects": rows}, indent=1))
        return 0
    print(f"{args.cell} (image {image}, one object at a time, network off)\n")
    print("| object | max RSS GiB | seconds | rc |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['object']} | {r['max_rss_kib'] / 2**20:.2f} | {r['seconds']} | {r['rc']} |")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
