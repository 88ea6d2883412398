"""Wheels for the wheel/verify tests: synthetic ones (seconds) and the real example extension.

Synthetic wheels hold a tiny .so compiled by nvcc for a chosen arch (no torch needed).
The real one is tests/example_ext built once for sm_100 against torch from the wheelhouse and
cached under .cache/example_ext/raw (gitignored); without torch in the wheelhouse it is skipped.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from tools import need_nvcc

from factory.matrix.cell import Cell
from factory.matrix.load import PackageSpec, PlannedCell, plan_cell
from factory.matrix.settings import Settings
from factory.recipes import get_recipe

REPO = Path(__file__).resolve().parent.parent
TORCH = "2.14.1"
WHEELHOUSE = Path(
    os.environ.get("FACTORY_TEST_WHEELHOUSE", REPO / ".cache/factory/wheelhouse/cp311")
)

KERNEL = r"""
__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }
extern "C" void launch_twice(float* x) { twice<<<1, 32>>>(x); }
"""


def compile_kernel_so(dest: Path, *gencode: str) -> Path:
    """A small shared object with device code for the given -gencode values."""
    src = dest.with_suffix(".cu")
    src.write_text(KERNEL)
    argv = [str(need_nvcc()), "-shared", "-Xcompiler", "-fPIC", "-o", str(dest), str(src)]
    for g in gencode:
        argv += ["-gencode", g]
    subprocess.run(argv, check=True, capture_output=True)
    return dest


def _record_line(name: str, data: bytes) -> tuple[str, str, str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return name, f"sha256={digest}", str(len(data))


def make_wheel(
    dest_dir: Path,
    *,
    name: str = "demo_ext",
    version: str = "0.1.0",
    tag: str = "cp311-cp311-linux_x86_64",
    files: Mapping[str, bytes],
    requires: Iterable[str] = (),
    metadata_extra: str = "",
    break_record: bool = False,
) -> Path:
    """A wheel as setuptools writes it: files, then dist-info with METADATA, WHEEL, RECORD."""
    dist_info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    meta += metadata_extra + "\nA demo extension.\n"
    wheel = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: {tag}\n"
    members = dict(files)
    members[f"{dist_info}/METADATA"] = meta.encode()
    members[f"{dist_info}/WHEEL"] = wheel.encode()
    members[f"{dist_info}/top_level.txt"] = f"{name}\n".encode()
    rows = [_record_line(n, d) for n, d in members.items()]
    if break_record:
        rows[0] = (rows[0][0], rows[0][1][:-4] + "AAAA", rows[0][2])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([*rows, (f"{dist_info}/RECORD", "", "")])
    members[f"{dist_info}/RECORD"] = buf.getvalue().encode()
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in members.items():
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            zf.writestr(info, d)
    return path


def ext_wheel(dest_dir: Path, so: Path, **kw: object) -> Path:
    """A wheel with a package demo_ext holding the compiled .so and an importable __init__."""
    files = {"demo_ext/__init__.py": b"VALUE = 42\n", "demo_ext/_kernels.so": so.read_bytes()}
    return make_wheel(dest_dir, files=files, **kw)  # type: ignore[arg-type]


def planned(
    package: str = "demo-ext",
    *,
    version: str = "0.1.0",
    archs: tuple[int, ...] = (90,),
    recipe: str = "torch-extension",
    plat: str = "manylinux_2_36_x86_64",
) -> PlannedCell:
    cell = Cell(
        package=package, version=version, torch=TORCH, cuda="13.0", archs=archs, python="3.11"
    )
    spec = PackageSpec(
        name=cell.package,
        recipe=get_recipe(recipe),
        versions=(version,),
        source="pypi",
        sha256=None,
        axes={},
    )
    return plan_cell(cell, spec, settings=Settings.from_table({"plat": plat, "manylinux": "auto"},
                                                              root=Path.cwd()))


def py_wheel(tmp_path: Path, init: bytes, tag: str = "cp311-cp311-linux_x86_64") -> Path:
    return make_wheel(tmp_path, files={"demo_ext/__init__.py": init}, tag=tag)
