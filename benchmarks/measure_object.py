"""Peak memory and time of compiling single objects of a cell, alone, in its build container.

The planner's per-job peak is what a whole build averages to; a few objects are much heavier
(flash-attn's backward hdim256 kernels). This compiles the named objects one at a time with the
exact command of the cell's build.ninja, in the cell's builder image with its venv and toolkit,
network off, and prints the largest resident set of the compile's processes (cicc and ptxas
dominate), the wall seconds and the CPU seconds (user + system of every compile process).

``--variant LABEL=FLAGS`` compiles each object again with FLAGS added to its nvcc command (e.g.
``split8=--split-compile=8``), after the command as built; with ``--keep DIR`` the objects are
kept and each variant's cubins are compared with the as-built ones (bytes, else SASS: -sass
needs nvdisasm, pip install nvidia-cuda-nvdisasm).

Needs a build tree: run ``factory build CELL`` first (it may stop early; build.ninja is written
before the first compile).

    python benchmarks/measure_object.py flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311 \\
        flash_bwd_hdim256_fp16_sm80 flash_fwd_hdim128_bf16_sm80
    python benchmarks/measure_object.py CELL flash_fwd_split_hdim64_fp16_sm80 \\
        --variant split2=--split-compile=2 --keep /tmp/objects
    python benchmarks/measure_object.py causal-conv1d-1.7.0-torch2.14.1-cu130-sm100-cp311 \\
        causal_conv1d_update causal_conv1d_fwd --narrow   # nine archs as asked, and one
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.build.job import build_image, cell_venv, cell_work_dir  # noqa: E402
from factory.matrix.load import load_matrix  # noqa: E402
from factory.runners.base import INSIDE  # noqa: E402
from factory.runners.inside.compilers import narrow  # noqa: E402
from factory.toolchain.sysroot import sysroot_dir  # noqa: E402
from factory.toolchain.toolkit import materialize_cuda_home  # noqa: E402
from factory.wheels.binaries import find_cuobjdump  # noqa: E402

PROBE = """
import json, resource, shutil, subprocess, sys, time
t0 = time.monotonic()
proc = subprocess.run(sys.argv[1], shell=True, capture_output=True, text=True)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
if proc.returncode == 0 and len(sys.argv) > 2:
    shutil.copy("/tmp/probe.o", sys.argv[2])
print(json.dumps({"rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
                  "cpu_seconds": round(ru.ru_utime + ru.ru_stime, 1),
                  "max_rss_kib": ru.ru_maxrss,
                  "tail": proc.stderr[-400:] if proc.returncode else ""}))
"""
KEEP = "/factory/keep"  # where --keep's directory is mounted in the container


def _cuobjdump(cuobjdump: Path, *args: str, cwd: Path | None = None) -> str:
    # -sass needs nvdisasm (the nvidia-cuda-nvdisasm wheel puts it beside cuobjdump's)
    env = {**os.environ, "NVDISASM_PATH": str(cuobjdump.parent)}
    return subprocess.run([str(cuobjdump), *args], capture_output=True, text=True, check=True,
                          env=env, cwd=cwd).stdout


def compare_code(cuobjdump: Path, obj: Path, ref: Path) -> str:
    """'same bytes' when the objects' cubins are byte-identical, else 'same SASS' when their
    disassembly matches, else 'differs'."""
    cubins = []
    for o in (obj, ref):
        d = o.with_suffix(".cubins")
        d.mkdir(exist_ok=True)
        _cuobjdump(cuobjdump, "-xelf", "all", str(o.resolve()), cwd=d)
        cubins.append(sorted(f.read_bytes() for f in d.glob("*.cubin")))
    if cubins[0] == cubins[1]:
        return "same bytes"
    text = [
        [line for line in _cuobjdump(cuobjdump, "-sass", str(o)).splitlines()
         if not line.lstrip().startswith(("Fatbin", "code for"))]  # these name the file
        for o in (obj, ref)
    ]
    return "same SASS" if text[0] == text[1] else "differs"


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
    # the build's toolkit (the factory's compiler wrappers) lived in its run dir: compile with
    # the real toolkit, exactly as the package asked (--narrow adds what the wrapper ran)
    cmd = cmd.replace(f"{INSIDE['run']}/toolkit", INSIDE["cuda"])
    return re.sub(r"-MF \S+", "-MF /tmp/probe.o.d", cmd)


def narrowed(cmd: str, archs: tuple[int, ...]) -> str:
    """The command the factory's nvcc wrapper runs for ``cmd`` in a cell of ``archs``."""
    argv = shlex.split(cmd)
    new, _ = narrow(argv[1:], archs)
    return shlex.join([argv[0], *new])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cell")
    ap.add_argument("objects", nargs="+",
                    help="object names without .o (e.g. flash_bwd_hdim256_fp16_sm80)")
    ap.add_argument("--matrix", type=Path, default=REPO / "matrix.toml")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=FLAGS",
                    help="also compile with FLAGS added to nvcc (repeatable)")
    ap.add_argument("--keep", type=Path,
                    help="keep the objects here; compare each variant's cubins with the as-built")
    ap.add_argument("--narrow", action="store_true",
                    help="also compile as the factory's nvcc wrapper does: the cell's archs only "
                    "(the as-built command is what the package asked for)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    variants = [("as built", "")]
    for v in args.variant:
        label, sep, flags = v.partition("=")
        if not sep or not label or not flags:
            ap.error(f"--variant {v!r}: expected LABEL=FLAGS, e.g. split2=--split-compile=2")
        variants.append((label, flags))
    matrix = load_matrix(args.matrix)
    (pc,) = [c for c in matrix.cells if c.cell.id == args.cell]
    src = cell_work_dir(matrix, pc) / "src"
    (build_dir,) = sorted((src / "build").glob("temp.*"))
    image = build_image(matrix, pc)
    venv = cell_venv(matrix, pc, "docker")
    cuda = materialize_cuda_home(pc.toolchain, matrix.settings.toolkits_dir)
    mounts = []
    if f"{INSIDE['sysroot']}/" in (build_dir / "build.ninja").read_text():
        root = sysroot_dir(matrix.settings.sysroots_dir, pc.cell.platform)
        mounts = ["-v", f"{root.resolve()}:{INSIDE['sysroot']}:ro"]
    keep = []
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        keep = ["-v", f"{args.keep.resolve()}:{KEEP}"]
        cuobjdump = find_cuobjdump()
    rows = []
    for name in args.objects:
        base = command_for(build_dir, name)
        commands = [(label, flags, f"{base} {flags}".strip()) for label, flags in variants]
        if args.narrow:
            commands.append(("narrowed to the cell", "", narrowed(base, pc.cell.archs)))
        for i, (label, flags, command) in enumerate(commands):
            kept = f"{name}.{i}.o"
            out = subprocess.run(
                ["docker", "run", "--rm", "--network", "none",
                 "-v", f"{src.resolve()}:{INSIDE['src']}:ro",
                 "-v", f"{venv.resolve()}:{INSIDE['venv']}:ro",
                 "-v", f"{Path(cuda).resolve()}:{INSIDE['cuda']}:ro", *mounts, *keep,
                 image, f"{INSIDE['venv']}/bin/python", "-c", PROBE,
                 command, *([f"{KEEP}/{kept}"] if keep else [])],
                capture_output=True, text=True, check=True,
            ).stdout
            row = {"object": name, "variant": label, "flags": flags,
                   "archs": sorted(set(re.findall(r"code=\[?sm_(\d+)", command))),
                   **json.loads(out)}
            if keep and row["rc"] == 0 and i > 0:
                row["code_vs_as_built"] = compare_code(
                    cuobjdump, args.keep / kept, args.keep / f"{name}.0.o")
            rows.append(row)
    if args.json:
        print(json.dumps({"cell": args.cell, "objects": rows}, indent=1))
        return 0
    print(f"{args.cell} (image {image}, one object at a time, network off)\n")
    print("| object | variant | SASS archs | max RSS GiB | wall s | CPU s | rc | code vs as built |"
          "\n|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['object']} | {r['variant']} | {len(r['archs'])} | "
              f"{r['max_rss_kib'] / 2**20:.2f} | {r['seconds']} | {r['cpu_seconds']} | {r['rc']} "
              f"| {r.get('code_vs_as_built', '-')} |")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
