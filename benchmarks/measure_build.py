"""Build a torch extension on this host while sampling its compile jobs' memory.

Copies SOURCE to a temp dir, runs `pip wheel --no-build-isolation` with MAX_JOBS and
TORCH_CUDA_ARCH_LIST set, samples the process tree (process_memory.PeakSampler, next to this
script), then reads the build's .ninja_log. Prints per-job peak RSS and per-object seconds; with
--record, folds them into a memory history file (factory.planning.memory_model).

    nice python benchmarks/measure_build.py tests/example_ext --jobs 2 --archs 10.0 \
        --cell factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311 [--record PATH]

Run it with the interpreter of an environment that has torch, setuptools, wheel and ninja.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from process_memory import PeakSampler  # noqa: E402

from factory.matrix.cell import Cell  # noqa: E402
from factory.planning.memory_model import BuildMeasurement, MemoryHistory  # noqa: E402
from factory.planning.ninja_log import read_ninja_log  # noqa: E402
from factory.units import format_size  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--archs", default="10.0", help="TORCH_CUDA_ARCH_LIST")
    ap.add_argument("--cell", help="cell id the measurement belongs to (for --record)")
    ap.add_argument("--record", type=Path, help="memory history file to update")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--log", type=Path, default=Path("measure_build.log"),
                    help="where the whole build output goes (default: ./measure_build.log)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="measure-") as tmp:
        tree = Path(tmp) / "src"
        shutil.copytree(args.source, tree, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        env = {**os.environ, "MAX_JOBS": str(args.jobs), "TORCH_CUDA_ARCH_LIST": args.archs,
               # torch >= 2.14 prefixes ccache/sccache when one is on PATH: the compilers then
               # run under the sccache server, outside this tree, and cache hits fake the times.
               "TORCH_NO_COMPILER_WRAPPER": "1"}
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
               "-w", str(Path(tmp) / "out"), str(tree)]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        with PeakSampler(proc.pid, interval=0.25) as sampler:
            out, _ = proc.communicate()
        wall = time.monotonic() - t0
        args.log.write_bytes(out)
        if proc.returncode != 0:
            text = out.decode(errors="replace")
            failed = text.find("FAILED:")
            sys.stdout.write(text[failed : failed + 4000] if failed >= 0 else text[-4000:])
            print(f"\nbuild failed (exit {proc.returncode}); whole log in {args.log}")
            return proc.returncode
        logs = list(tree.glob("build/temp*/.ninja_log"))
        seconds = read_ninja_log(logs[0]) if logs else {}

    result = {
        "jobs": args.jobs, "archs": args.archs, "wall_seconds": round(wall, 1),
        "peak_job_bytes": sampler.peak_job_bytes, "peak_tree_bytes": sampler.peak_total_bytes,
        "peak_parallel_jobs": sampler.peak_jobs, "samples": sampler.samples,
        "object_seconds": {k: round(v, 2) for k, v in sorted(seconds.items())},
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"MAX_JOBS={args.jobs} archs={args.archs}: wall {wall:.0f} s, "
              f"peak per job {format_size(sampler.peak_job_bytes)}, "
              f"peak whole tree {format_size(sampler.peak_total_bytes)}, "
              f"{sampler.peak_jobs} job(s) at once, {sampler.samples} samples")
        for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]):
            print(f"    {v:7.1f} s  {k}")
    if args.record:
        if not args.cell:
            ap.error("--record needs --cell")
        MemoryHistory.load(args.record).record(BuildMeasurement(
            cell=Cell.from_id(args.cell), nvcc_threads=1, max_jobs=args.jobs,
            peak_job_bytes=sampler.peak_job_bytes, object_seconds=seconds,
            source=f"host build, MAX_JOBS={args.jobs}, {time.strftime('%Y-%m-%d')}",
        ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
