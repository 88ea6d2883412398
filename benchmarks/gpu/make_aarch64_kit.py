"""Make the files the GPU machine needs to cross-build aarch64 cells with no network (run here,
on a builder with the network and binutils-aarch64-linux-gnu; then carry KIT/ to the GPU machine
with benchmarks/gpu/aarch64.sh):

  KIT/debs/*.deb            the aarch64 cross compiler (Debian's crossbuild packages, without the
                            sanitizer runtimes), unpacked there with dpkg-deb -x: no root, no apt
  KIT/wheelhouse/cpXY-aarch64/
      torch-V-cpXY-cpXY-manylinux_2_28_aarch64.whl  a link kit, not torch: the aarch64 wheel's
                            headers and, for each library an extension links, a stub with the
                            same soname and dynamic symbols (the real libraries are 750 MB; the
                            wheel's device code does not depend on them)
      nvidia_cuda_runtime-...aarch64.whl  the real one (libcudart for -lcudart)
                            (the local runner with --python-env existing uses a target
                            wheelhouse as it is: no download there)

  python3 benchmarks/gpu/make_aarch64_kit.py KIT --torch 2.11.0 --python 3.12 --cuda 13.0 \
      [--torch-wheel FILE] [--debs DIR]

Prints every file and the total size: one carry must stay under 64 MiB.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# what torch's CUDAExtension links (-lc10 -ltorch -ltorch_cpu -ltorch_python -lc10_cuda -ltorch_cuda)
LINKED = (
    "libc10.so",
    "libc10_cuda.so",
    "libtorch.so",
    "libtorch_cpu.so",
    "libtorch_cuda.so",
    "libtorch_python.so",
)
DEBS = re.compile(r"(arm64-cross|aarch64-linux-gnu).*\.deb$")
SANITIZERS = re.compile(r"lib(asan|tsan|lsan|ubsan|hwasan)\d")


def run(*argv: str | Path, **kw: object) -> str:
    return subprocess.run(
        [str(a) for a in argv], check=True, capture_output=True, text=True, **kw
    ).stdout  # type: ignore[call-overload,no-any-return]


# Num: Value Size Type Bind Vis [flags such as VARIANT_PCS] Ndx Name[@version] [(version index)]
_DYNSYM = re.compile(
    r"^\s*\d+:\s+[0-9a-f]+\s+(?P<size>\S+)\s+(?P<type>\w+)\s+(?P<bind>\w+)\s+\w+"
    r"\s+(?:\[[^\]]*\]\s+)?(?P<ndx>\S+)\s+(?P<name>\S+)"
)


def stub_library(real: Path, dest: Path, work: Path) -> None:
    """A shared object with ``real``'s soname and defined dynamic symbols, and no code: enough
    for the linker, which records the soname and leaves the symbols to the loader."""
    soname = re.search(
        r"\(SONAME\)\s+Library soname: \[(.+?)\]", run("aarch64-linux-gnu-readelf", "-dW", real)
    )
    lines = [".text"]
    data, tls = [".data"], ['.section .tbss,"awT",%nobits']
    for ln in run("aarch64-linux-gnu-readelf", "--dyn-syms", "-W", real).splitlines():
        m = _DYNSYM.match(ln)
        if not m or m["ndx"] == "UND" or m["bind"] not in ("GLOBAL", "WEAK"):
            continue
        name = m["name"].split("@")[0]
        kind, size = m["type"], int(m["size"], 0) if m["size"].startswith("0x") else int(m["size"])
        bind = ".weak" if m["bind"] == "WEAK" else ".globl"
        if kind == "FUNC" or kind == "IFUNC":
            lines += [f"{bind} {name}", f".type {name},%function", f"{name}: ret"]
        elif kind == "OBJECT":
            data += [
                f"{bind} {name}",
                f".type {name},%object",
                f".size {name},{size}",
                f"{name}: .zero {max(size, 1)}",
            ]
        elif kind == "TLS":
            tls += [
                f"{bind} {name}",
                f".type {name},%tls_object",
                f".size {name},{size}",
                f"{name}: .zero {max(size, 1)}",
            ]
    asm = work / (real.name + ".s")
    asm.write_text("\n".join(lines + data + tls) + "\n")
    run(
        "aarch64-linux-gnu-gcc",
        "-shared",
        "-nostdlib",
        "-o",
        dest,
        asm,
        *(["-Wl,-soname," + soname.group(1)] if soname else []),
    )


def link_kit_wheel(torch_wheel: Path, out_dir: Path, work: Path) -> Path:
    unpacked = work / "torch"
    with zipfile.ZipFile(torch_wheel) as zf:
        members = [
            n
            for n in zf.namelist()
            if n.startswith("torch/include/") or n in {f"torch/lib/{lib}" for lib in LINKED}
        ]
        zf.extractall(unpacked, members)
        dist_info = next(
            n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA")
        )
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        wheel_file = zf.read(f"{dist_info}/WHEEL").decode()
    for lib in LINKED:
        real = unpacked / "torch" / "lib" / lib
        stub = work / lib
        stub_library(real, stub, work)
        shutil.move(stub, real)
    # no Requires-Dist: the kit is installed with --no-deps, and nothing imports it
    metadata = "\n".join(ln for ln in metadata.splitlines() if not ln.startswith("Requires-Dist"))
    out = out_dir / torch_wheel.name
    record = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for path in sorted(p for p in (unpacked / "torch").rglob("*") if p.is_file()):
            arc = str(path.relative_to(unpacked))
            data = path.read_bytes()
            zf.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        for name, text in (("METADATA", metadata + "\n"), ("WHEEL", wheel_file)):
            zf.writestr(f"{dist_info}/{name}", text)
            digest = (
                base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
                .rstrip(b"=")
                .decode()
            )
            record.append(f"{dist_info}/{name},sha256={digest},{len(text.encode())}")
        record.append(f"{dist_info}/RECORD,,")
        zf.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("kit", type=Path)
    ap.add_argument("--torch", default="2.11.0")
    ap.add_argument("--python", default="3.12")
    ap.add_argument("--cuda", default="13.0")
    ap.add_argument("--torch-wheel", type=Path, default=None)
    ap.add_argument("--debs", type=Path, default=Path("/var/cache/apt/archives"))
    args = ap.parse_args()
    from factory.toolchain.cross import target_runtime_requirement
    from factory.toolchain.wheelhouse import download_wheels

    cp = "cp" + args.python.replace(".", "")
    wheelhouse = args.kit / "wheelhouse" / f"{cp}-aarch64"
    debs = args.kit / "debs"
    for d in (wheelhouse, debs):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    for deb in sorted(args.debs.glob("*.deb")):
        if DEBS.search(deb.name) and not SANITIZERS.search(deb.name):
            shutil.copy2(deb, debs)
    if not any(debs.glob("g++-*aarch64-linux-gnu*.deb")):
        print(
            "ERROR no aarch64 cross g++ .deb in --debs: apt-get install --download-only "
            "crossbuild-essential-arm64",
            file=sys.stderr,
        )
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        torch_wheel = args.torch_wheel
        if torch_wheel is None:
            (torch_wheel,) = download_wheels(
                [f"torch=={args.torch}"],
                work / "dl",
                python=args.python,
                platform="aarch64",
                no_deps=True,
            )
        link_kit_wheel(torch_wheel, wheelhouse, work)
        runtime = download_wheels(
            [target_runtime_requirement(args.cuda) + f"=={args.cuda}.*"],
            wheelhouse,
            python=args.python,
            platform="aarch64",
            no_deps=True,
        )
    files = sorted(p for p in args.kit.rglob("*") if p.is_file())
    total = 0
    for p in files:
        total += p.stat().st_size
        print(f"{p.stat().st_size / 2**20:8.1f} MiB  {p.relative_to(args.kit)}")
    print(f"{total / 2**20:8.1f} MiB  total ({len(files)} files; runtime {runtime[0].name})")
    print(json.dumps({"torch": args.torch, "python": args.python, "cuda": args.cuda}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
