"""The catalog for real: causal-conv1d 1.7.0 from its PyPI sdist, built for sm_100 in the docker
runner. Its setup.py hard-codes nine -gencode targets with no variable to change them; the
wheel must hold sm_100 SASS only, be built with C++20 against torch 2.14.1, and import in a
clean venv. It shares the session's wheelhouse, venvs (its build requirements are the bundled
example's), base image, toolkit and glibc sysroot, and the compile cache (a second run on one
builder takes its objects from there: the narrowed nvcc command is the cache key)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, cache_root

from factory.wheels.binaries import find_cuobjdump

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.download]

CELL = "causal-conv1d-1.7.0-torch2.14.1-cu130-sm100-cp311"
WHEEL = "causal_conv1d-1.7.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_x86_64.whl"
SHA256 = "3202758494eaa7b597ce1c282dfa188889506bfcb92cad3c407d26736bfcd32b"
HARD_CODED = [75, 80, 87, 90, 100, 103, 110, 120, 121]  # its setup.py with CUDA 13


def _matrix(tmp: Path, work: Path) -> Path:
    path = tmp / "matrix.toml"
    path.write_text(f"""\
version = 1
[settings]
store = "{tmp / 'store'}"
wheelhouse = "{cache_root() / 'wheelhouse'}"
work-dir = "{work}"
venv-dir = "{cache_root() / 'venvs'}"
[settings.compile-cache]
dir = "{cache_root() / 'compile-cache'}"
[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [["10.0"]]
python = ["3.11"]
[packages.causal-conv1d]
recipe = "causal-conv1d"
versions = ["1.7.0"]
sha256 = "{SHA256}"
""")
    return path


@pytest.fixture
def work() -> Path:
    """The cell's build tree beside the session's toolkits and sysroots (work-dir's parent),
    removed afterwards."""
    root = cache_root() / "work-catalog-test"
    shutil.rmtree(root / CELL, ignore_errors=True)
    yield root
    shutil.rmtree(root / CELL, ignore_errors=True)


def test_causal_conv1d_from_its_sdist_holds_the_cells_arch_only(
    tmp_path: Path, work: Path, base_image: str, wheelhouse_cp311: Path, cuda13_home: Path,
    no_leftover_containers: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FACTORY_MEMORY_HISTORY", str(tmp_path / "history.json"))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "factory", "build", CELL, "--matrix", str(_matrix(tmp_path, work)),
         "--memory", "6g", "--cache", "--publish", "--out", str(out), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=3600, env={**os.environ, "CI": "true"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    wheel = out / WHEEL
    assert wheel.is_file(), sorted(p.name for p in out.iterdir())

    # SASS for sm_100 only, in the one extension module, though setup.py asked for nine archs
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist()
                 if n.startswith("causal_conv1d_cuda") and n.endswith(".so")]
        (tmp_path / "ext.so").write_bytes(zf.read(so))
    elf = subprocess.run([str(find_cuobjdump()), "--list-elf", str(tmp_path / "ext.so")],
                         capture_output=True, text=True, timeout=120).stdout
    assert {ln.rsplit(".", 2)[-2] for ln in elf.splitlines() if ".cubin" in ln} == {"sm_100"}, elf

    # the wrapper narrowed each of the three kernel files' nine targets to sm_100
    logs = work / CELL / "logs"
    (report_path,) = logs.glob("*-attempt-1.log.report.json")
    compilers = json.loads(report_path.read_text())["compilers"]
    assert compilers["narrowed"] == 3 and compilers["refused"] is None
    assert compilers["asked_archs"] == HARD_CODED and compilers["compiled_archs"] == [100]
    assert ("nvcc: the package asked for sm_75, sm_80, sm_87, sm_90, sm_100, sm_103, sm_110, "
            "sm_120, sm_121; 3 call(s) narrowed; compiled sm_100") in proc.stderr
    records = [json.loads(ln) for ln in next(logs.glob("*-attempt-1.log.compilers.jsonl"))
               .read_text().splitlines()]
    assert sorted(Path(r["source"]).name for r in records) == [
        "causal_conv1d_bwd.cu", "causal_conv1d_fwd.cu", "causal_conv1d_update.cu"]

    # C++20 against torch 2.14.1, as the compilers ran it. ninja's lines show each command as
    # the wrappers got it (every compile goes through one: nvcc or factory-c++); a -std they
    # raised is in their records. causal-conv1d pins no -std for CUDA and torch 2.14.1's builder
    # adds -std=c++20, so they raised none here (tests/unit/test_compilers.py raises a c++17).
    assert compilers["std_raised"] == 0 and not [r for r in records if r.get("std")], records
    build_log = (logs / report_path.name.removesuffix(".report.json")).read_text()
    ran = {}
    for line in build_log.splitlines():
        m = re.match(r"^\[\d+/\d+\] (\S+) ", line)
        if not m or not re.search(r"\.(cu|cpp) ", line):
            continue
        assert re.search(r"/run/toolkit/bin/(nvcc|factory-c\+\+)$", m.group(1)), line
        argv = shlex.split(line.split("] ", 1)[1])
        (source,) = [Path(a).name for a in argv if re.search(r"\.(cu|cpp)$", a)]
        ran[source] = [a for a in argv if a.startswith("-std=")]
    assert ran == {name: ["-std=c++20"] for name in (
        "causal_conv1d.cpp", "causal_conv1d_fwd.cu", "causal_conv1d_bwd.cu",
        "causal_conv1d_update.cu")}, ran
    manifest = json.loads((out / (WHEEL + ".provenance.json")).read_text())
    assert manifest["toolchain"]["torch_requirement"] == "torch==2.14.1"
    assert manifest["attempts"][-1]["compilers"] == compilers  # the attempt record's summary

    # verified on the way (the build's own verify: SASS, tags, the manylinux_2_28 floor, a
    # clean-venv import with the cell's torch)
    # each line of the cell's build starts with its short id in CI: "[causal-conv1d@...] pass X:"
    checks = (re.match(r"^(?:\[[^\]]+\])?\s*pass (\S+):", ln.strip())
              for ln in proc.stderr.splitlines())
    passed = {m.group(1): m.string for m in checks if m}
    assert {"archs", "glibc", "import", "torch-pin", "local-tag"} <= set(passed), proc.stderr
    assert "SASS sm_100 in 1 file(s), no PTX" in passed["archs"]
    assert "tag manylinux_2_28" in passed["glibc"]
    assert "imported torch, causal_conv1d, causal_conv1d_cuda with torch 2.14.1" in passed["import"]
