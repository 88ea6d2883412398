"""Compile once: the bundled extension built for two Python versions through the factory with
the shared compile cache, cold cache first.

For each build: the compile step's wall time and per-object times (ninja's log), the hits and
misses of the direct layer (ccache, whole objects) and of sccache (per step), and the sha256 of
every cubin in the wheel's .so (``cuobjdump -xelf all``).
The claim: the second Python version's compile time is at most 20 % of the first's and its
kernels are the same bytes.

    python benchmarks/bench_compile_cache.py                      # cp311, then cp313
    python benchmarks/bench_compile_cache.py --image-313 factory-base:trixie   # another release
    python benchmarks/bench_compile_cache.py --json results.json

Needs the docker engine, the builder images (made on first use) and the wheelhouses of both
Python versions (downloaded on first use). One heavy build at a time: run it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / ".cache" / "factory" / "bench-compile-cache"
CELL = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-{tag}"
FA_SHA256 = "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b"

MATRIX = """version = 1
[settings]
store = "{bench}/store"
wheelhouse = "{repo}/.cache/factory/wheelhouse"
work-dir = "{repo}/.cache/factory/bench-compile-cache-work"
venv-dir = "{repo}/.cache/factory/venvs"
runner = "docker"
base-image = "factory-base:bookworm"
[settings.images]
{images}
[settings.compile-cache]
dir = "{bench}/compile-cache"
size = "{size}"
[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [["10.0"]]
python = [{pythons}]
[packages.factory-example-ext]
recipe = "torch-extension"
versions = ["0.1.0"]
source = "{repo}/tests/example_ext"
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildMeasure:
    python: str
    image: str
    factory_seconds: float  # the whole `factory build` (install, compile, repair, verify)
    compile_seconds: float  # ninja: first object started -> last object finished
    object_seconds: dict[str, float]  # object -> its compile time
    kernel_objects: tuple[str, ...]  # objects compiled by nvcc
    cache: dict[str, Any]
    cubins: dict[str, str]  # cubin file -> sha256
    wheel: str

    @property
    def kernel_seconds(self) -> float:
        return sum(self.object_seconds[o] for o in self.kernel_objects)

    @property
    def other_seconds(self) -> float:
        return sum(v for k, v in self.object_seconds.items() if k not in self.kernel_objects)


def ninja_times(build_dir: Path) -> tuple[float, dict[str, float], tuple[str, ...]]:
    """(span, per-object seconds, nvcc objects) from .ninja_log and build.ninja."""
    log = build_dir / ".ninja_log"
    starts, ends, per = [], [], {}
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _, out, *_ = line.split("\t")
        starts.append(int(start))
        ends.append(int(end))
        per[Path(out).name] = (int(end) - int(start)) / 1000
    kernels = []
    for line in (build_dir / "build.ninja").read_text().splitlines():
        if line.startswith("build ") and ": cuda_compile " in line:
            kernels.append(Path(line[len("build ") :].split(":")[0].replace("$:", ":")).name)
    return (max(ends) - min(starts)) / 1000, per, tuple(sorted(kernels))


def cubin_hashes(wheel: Path) -> dict[str, str]:
    from factory.wheels.binaries import find_cuobjdump

    cuobjdump = str(find_cuobjdump())
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as zf:
            libs = [n for n in zf.namelist() if n.endswith(".so") or ".so." in n]
            for name in libs:
                zf.extract(name, tmp)
        out = {}
        for i, lib in enumerate(libs):
            where = Path(tmp) / f"cubins-{i}"
            where.mkdir()
            subprocess.run(
                [cuobjdump, "-xelf", "all", str(Path(tmp) / lib)],
                cwd=where,
                check=True,
                capture_output=True,
            )
            for cubin in sorted(where.glob("*.cubin")):
                # cuobjdump names them after the library (_C.cpython-311-...so.1.sm_100.cubin),
                # which differs per Python: compare by what follows.
                key = cubin.name.removeprefix(Path(lib).name.split(".so")[0] + ".")
                out[key] = hashlib.sha256(cubin.read_bytes()).hexdigest()
        return out


def run_build(matrix: Path, python: str, image: str, dist: Path) -> BuildMeasure:
    tag = "cp" + python.replace(".", "")
    cell = CELL.format(tag=tag)
    cmd = [
        sys.executable,
        "-m",
        "factory",
        "build",
        cell,
        "--cache",
        "--matrix",
        str(matrix),
        "--out",
        str(dist),
        "--force",
        "--json",
        # The import check installs into a venv of the wheel's Python on this host, which need
        # not have Python 3.13; it is not part of what this measures.
        "--no-import-check",
    ]
    print("+", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    # The builds' memory records go next to the benchmark, not into the shipped history.
    env = {**os.environ, "FACTORY_MEMORY_HISTORY": str(BENCH / "memory_history.json")}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t0
    sys.stderr.write(proc.stderr[-3000:])
    if proc.returncode != 0:
        raise SystemExit(f"factory build {cell} failed (exit {proc.returncode})")
    outcome = json.loads(proc.stdout[proc.stdout.index("{") :])["outcomes"][0]
    work = REPO / ".cache/factory/bench-compile-cache-work" / cell
    (build_dir,) = [
        p for p in (work / "src" / "build").glob("temp.*") if (p / ".ninja_log").exists()
    ]
    span, per, kernels = ninja_times(build_dir)
    report_path = Path(outcome["attempts"][-1]["log"] + ".report.json")
    report = json.loads(report_path.read_text())
    from factory.build.compile_cache import stats_from_report

    stats = stats_from_report(report)
    wheel = Path(outcome["wheel"])
    return BuildMeasure(
        python=python,
        image=image,
        factory_seconds=round(seconds, 1),
        compile_seconds=span,
        object_seconds=per,
        kernel_objects=kernels,
        cache=stats.as_dict() if stats else {},
        cubins=cubin_hashes(wheel),
        wheel=wheel.name,
    )


def table(first: BuildMeasure, second: BuildMeasure) -> str:
    def pct(a: float, b: float) -> str:
        return f"{100 * a / b:.0f} %" if b else "-"

    same = first.cubins == second.cubins and bool(first.cubins)
    rows = [
        (
            "Python / image",
            f"{first.python} / {first.image}",
            f"{second.python} / {second.image}",
            "",
        ),
        (
            "compile (ninja span)",
            f"{first.compile_seconds:.1f} s",
            f"{second.compile_seconds:.1f} s",
            pct(second.compile_seconds, first.compile_seconds),
        ),
        (
            f"nvcc objects ({len(first.kernel_objects)} .cu, sum)",
            f"{first.kernel_seconds:.1f} s",
            f"{second.kernel_seconds:.1f} s",
            pct(second.kernel_seconds, first.kernel_seconds),
        ),
        (
            "host C++ objects (take the interpreter's CFLAGS)",
            f"{first.other_seconds:.1f} s",
            f"{second.other_seconds:.1f} s",
            pct(second.other_seconds, first.other_seconds),
        ),
        (
            "whole `factory build`",
            f"{first.factory_seconds:.0f} s",
            f"{second.factory_seconds:.0f} s",
            pct(second.factory_seconds, first.factory_seconds),
        ),
        (
            "sccache hits / misses",
            f"{first.cache.get('hits')} / {first.cache.get('misses')}",
            f"{second.cache.get('hits')} / {second.cache.get('misses')}",
            "",
        ),
        (
            "whole objects from the direct layer (ccache)",
            f"{first.cache.get('direct_hits', 0)} of "
            f"{first.cache.get('direct_hits', 0) + first.cache.get('direct_misses', 0)}",
            f"{second.cache.get('direct_hits', 0)} of "
            f"{second.cache.get('direct_hits', 0) + second.cache.get('direct_misses', 0)}",
            "",
        ),
        (
            "whole objects from sccache (its misses)",
            f"{first.cache.get('object_hits')} of "
            f"{first.cache.get('object_hits', 0) + first.cache.get('object_misses', 0)}",
            f"{second.cache.get('object_hits')} of "
            f"{second.cache.get('object_hits', 0) + second.cache.get('object_misses', 0)}",
            "",
        ),
        (
            "cubins (sha256 equal)",
            str(len(first.cubins)),
            str(len(second.cubins)),
            "identical" if same else "DIFFERENT",
        ),
    ]
    out = ["| | first | second | second / first |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(out)


# -- a few real flash-attn kernels -------------------------------------------------------------
# flash-attn 2.8.3.post2's own nvcc flags (its setup.py) with -std=c++20, as torch 2.14 needs, one
# arch and one nvcc thread, plus the -I/-D flags torch's extension builder adds. Compiled through
# the same nvcc wrapper and inside paths as a factory build, in each Python's build venv.
FA_KERNELS = ("flash_fwd_hdim64_fp16_sm80", "flash_fwd_hdim64_bf16_sm80")
FA_SCRIPT = r"""set -eu
export PATH=/factory/venv/bin:/factory/cuda/bin:$PATH CUDA_HOME=/factory/cuda
. /factory/run/cache.env
sccache --start-server >/dev/null
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pyinc=$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
t0=$(date +%s.%N)
printf '%s\n' {kernels} | xargs -P 2 -I K /factory/run/nvcc-cached \
  -MD -MF /factory/out/K.o.d -I/factory/src/csrc/flash_attn -I/factory/src/csrc/flash_attn/src \
  -I/factory/src/csrc/cutlass/include -I$site/torch/include \
  -I$site/torch/include/torch/csrc/api/include -I/factory/cuda/include -I/factory/venv/include \
  -I$pyinc -c /factory/src/csrc/flash_attn/src/K.cu -o /factory/out/K.o \
  -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
  -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr --compiler-options -fPIC -O3 -std=c++20 \
  -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__ \
  -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-extended-lambda --use_fast_math \
  -gencode arch=compute_100,code=sm_100 --threads 1 -DTORCH_API_INCLUDE_EXTENSION_H \
  -DTORCH_EXTENSION_NAME=flash_attn_2_cuda -D_GLIBCXX_USE_CXX11_ABI=1
t1=$(date +%s.%N)
echo "$t0 $t1" > /factory/out/seconds
sccache --show-stats --stats-format json > /factory/out/stats.json
sccache --stop-server >/dev/null
"""


def build_venv(matrix_path: Path, python: str) -> Path:
    """The venv the factory build of this Python's cell used (torch for this Python)."""
    from factory.build.job import cell_venv
    from factory.matrix.load import load_matrix

    matrix = load_matrix(matrix_path)
    (pc,) = [c for c in matrix.cells if c.cell.python == python]
    return cell_venv(matrix, pc, "docker")


def flash_attn_kernels(
    python: str, image: str, kernels: tuple[str, ...], size: str, venv: Path
) -> dict[str, Any]:
    import shlex

    from factory.build.compile_cache import parse_stats
    from factory.runners.cache_config import inside_config
    from factory.runners.inside.cache import direct_stats as _direct_stats

    tag = "cp" + python.replace(".", "")
    cuda = REPO / ".cache/factory/toolkits/cuda-13.0"
    src = BENCH / "flash-attn-src"
    if not src.exists():
        import tarfile

        from factory.toolchain.sdist import fetch_sdist

        sdist = fetch_sdist(
            "flash-attn", "2.8.3.post2", FA_SHA256, REPO / ".cache/factory/wheelhouse/sdists"
        )
        with tarfile.open(sdist) as tf:
            tf.extractall(BENCH / "unpack", filter="data")
        (BENCH / "unpack" / "flash_attn-2.8.3.post2").rename(src)
    run_dir, out = BENCH / f"fa-run-{tag}", BENCH / f"fa-out-{tag}"
    for d in (run_dir, out):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    # the cache as a factory build in the docker runner has it: env, dirs, the nvcc wrapper
    cfg = inside_config(root="/factory/cache", size=size, normalize_paths=True)
    env = {**cfg["env"], **cfg["direct"]["env"], "SCCACHE_DIR": cfg["dir"],
           "SCCACHE_IDLE_TIMEOUT": "0"}
    (run_dir / "cache.env").write_text(
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    wrapper = run_dir / Path(cfg["nvcc_wrapper"]["path"]).name
    wrapper.write_text(cfg["nvcc_wrapper"]["text"])
    wrapper.chmod(0o755)
    script = FA_SCRIPT.format(kernels=" ".join(kernels))
    mounts = {
        venv: "/factory/venv",
        src: "/factory/src:ro",
        cuda: "/factory/cuda:ro",
        BENCH / "compile-cache": "/factory/cache",
        run_dir: "/factory/run",
        out: "/factory/out",
    }
    cmd = [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "--memory",
        "12g",
        "--memory-swap",
        "12g",
        "--cpus",
        "2",
    ]
    for host, inside in mounts.items():
        cmd += ["-v", f"{host.resolve()}:{inside}"]
    print(f"+ flash-attn: {len(kernels)} kernel(s) for Python {python} in {image}", flush=True)
    subprocess.run([*cmd, image, "sh", "-c", script], check=True)
    t0, t1 = (float(x) for x in (out / "seconds").read_text().split())
    cubins = {}
    for k in kernels:
        cubins.update({f"{k}:{n}": h for n, h in _cubins_of(out / f"{k}.o").items()})
    stats = parse_stats((out / "stats.json").read_text())
    direct = _direct_stats(str(run_dir / Path(env["CCACHE_STATSLOG"]).name))
    stats = dataclasses.replace(stats, direct_hits=direct["hits"], direct_misses=direct["misses"])
    return {
        "python": python,
        "image": image,
        "seconds": round(t1 - t0, 1),
        "cache": stats.as_dict(),
        "cubins": cubins,
    }


def _cubins_of(binary: Path) -> dict[str, str]:
    from factory.wheels.binaries import find_cuobjdump

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(find_cuobjdump()), "-xelf", "all", str(binary.resolve())],
            cwd=tmp,
            check=True,
            capture_output=True,
        )
        return {
            c.name: hashlib.sha256(c.read_bytes()).hexdigest()
            for c in sorted(Path(tmp).glob("*.cubin"))
        }


def fa_table(a: dict[str, Any], b: dict[str, Any], n: int) -> str:
    same = a["cubins"] == b["cubins"] and bool(a["cubins"])
    rows = [
        ("Python / image", f"{a['python']} / {a['image']}", f"{b['python']} / {b['image']}", ""),
        (
            "compile (2 at a time)",
            f"{a['seconds']:.1f} s",
            f"{b['seconds']:.1f} s",
            f"{100 * b['seconds'] / a['seconds']:.0f} %",
        ),
        (
            "whole objects from the direct layer (ccache)",
            f"{a['cache']['direct_hits']} of {n}",
            f"{b['cache']['direct_hits']} of {n}",
            "",
        ),
        (
            "whole objects from sccache (its misses)",
            f"{a['cache']['object_hits']} of {a['cache']['direct_misses']}",
            f"{b['cache']['object_hits']} of {b['cache']['direct_misses']}",
            "",
        ),
        (
            "cubins (sha256 equal)",
            str(len(a["cubins"])),
            str(len(b["cubins"])),
            "identical" if same else "DIFFERENT",
        ),
    ]
    out = [
        f"\nflash-attn 2.8.3.post2, {n} kernel(s), sm_100:",
        "| | first | second | second / first |",
        "|---|---|---|---|",
    ]
    return "\n".join(out + [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--python", action="append", default=None, help="two versions, in order (default 3.11 3.13)"
    )
    ap.add_argument(
        "--image-313",
        default="factory-base:bookworm-py3.13",
        help="the image for Python 3.13 (default: bookworm with CPython 3.13)",
    )
    ap.add_argument("--size", default="5G", help="the cache's bound")
    ap.add_argument("--json", type=Path, default=None, help="write the measurements here")
    ap.add_argument(
        "--flash-attn",
        type=int,
        default=0,
        metavar="N",
        help=f"also compile N (<= {len(FA_KERNELS)}) flash-attn kernels per Python version",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    pythons = args.python or ["3.11", "3.13"]
    if len(pythons) != 2:
        ap.error("give two --python versions")
    images = {"3.13": args.image_313}
    shutil.rmtree(BENCH, ignore_errors=True)
    shutil.rmtree(REPO / ".cache/factory/bench-compile-cache-work", ignore_errors=True)
    BENCH.mkdir(parents=True)
    matrix = BENCH / "matrix.toml"
    matrix.write_text(
        MATRIX.format(
            bench=BENCH,
            repo=REPO,
            size=args.size,
            images="\n".join(f'"{k}" = "{v}"' for k, v in images.items()),
            pythons=", ".join(f'"{p}"' for p in pythons),
        )
    )
    measures = []
    for python in pythons:
        image = images.get(python, "factory-base:bookworm")
        measures.append(run_build(matrix, python, image, BENCH / "dist"))
    first, second = measures
    print()
    print(table(first, second))
    ratio = second.compile_seconds / first.compile_seconds
    print(
        f"\nsecond compile / first: {100 * ratio:.0f} %; "
        f"kernels identical: {first.cubins == second.cubins and bool(first.cubins)}"
    )
    fa = []
    if args.flash_attn:
        kernels = FA_KERNELS[: args.flash_attn]
        fa = [
            flash_attn_kernels(
                m.python, m.image, kernels, args.size, build_venv(matrix, m.python)
            )
            for m in measures
        ]
        print(fa_table(fa[0], fa[1], len(kernels)))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "version": 1,
                    "builds": [
                        {**dataclasses.asdict(m), "kernel_seconds": m.kernel_seconds}
                        for m in measures
                    ],
                    "flash_attn": fa,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
