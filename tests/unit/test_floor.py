"""The glibc floor: read from the binaries, planned before compiling, checked by verify, and the
sysroot that reaches it (factory.wheels.floor, factory.toolchain.sysroot)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import write_example_matrix
from wheel_fixtures import make_wheel

from factory.errors import ConfigError, ToolchainError, WheelError
from factory.matrix.load import load_matrix
from factory.matrix.manylinux import floor_policy
from factory.toolchain import sysroot
from factory.toolchain.sysroot import plan_floor
from factory.wheels.floor import (
    VersionNeed,
    floor_of,
    lower_floor_tip,
    promised_glibc,
    wheel_floor,
)
from factory.wheels.verify import verify_wheel


def _need(version: str, library: str = "libc.so.6", *symbols: str) -> VersionNeed:
    return VersionNeed(version=version, library=library, member="pkg/_C.so", symbols=symbols)


def test_the_floor_is_the_lowest_policy_holding_every_need() -> None:
    needs = [_need("GLIBC_2.2.5", "libc.so.6", "free"), _need("GLIBC_2.14", "libc.so.6", "memcpy"),
             _need("GLIBCXX_3.4.21", "libstdc++.so.6", "_ZNSt7__cxx11")]
    floor = floor_of(needs, files=1)
    assert floor.policy == "manylinux_2_24"  # GLIBCXX_3.4.21 is newer than manylinux2014's
    assert floor.highest == {"GLIBC": "GLIBC_2.14", "GLIBCXX": "GLIBCXX_3.4.21"}
    assert [n.version for n in floor.set_by] == ["GLIBCXX_3.4.21"]


def test_what_sets_the_floor_is_named_with_its_symbols() -> None:
    # exp() got a new version in glibc 2.29: a binary linked on a newer glibc needs it
    needs = [_need("GLIBC_2.29", "libm.so.6", "exp", "log"), _need("GLIBC_2.14")]
    floor = floor_of(needs, files=1)
    assert floor.policy == "manylinux_2_31" and floor.glibc == (2, 31)
    assert floor.platform == "manylinux_2_31_x86_64"
    assert "GLIBC_2.29 from libm.so.6 (exp, log)" in floor.why()
    assert floor.as_dict()["set_by"][0]["symbols"] == ["exp", "log"]


def test_versions_of_other_libraries_do_not_move_the_floor() -> None:
    needs = [_need("libcudart.so.13", "libcudart.so.13", "cudaMalloc"), _need("GLIBC_2.2.5")]
    assert floor_of(needs, files=1).policy == "manylinux_2_5"
    assert floor_of([], files=0).policy == "none"


def test_floor_names_are_auditwheel_policies() -> None:
    assert floor_policy("2_28").name == "manylinux_2_28"
    assert floor_policy("2.31").glibc == (2, 31)
    with pytest.raises(WheelError, match="no manylinux policy for glibc 2.29"):
        floor_policy("2_29")
    with pytest.raises(WheelError, match="not a glibc floor"):
        floor_policy("bullseye")
    both = "x-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    assert promised_glibc(both) == (2, 17)
    assert promised_glibc("x-1.0-cp311-cp311-linux_x86_64.whl") is None


# -- a real binary --------------------------------------------------------------------------
def _libm_so(tmp_path: Path) -> Path:
    """A shared object calling exp(): on glibc >= 2.29 it binds exp@GLIBC_2.29."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc not installed")
    src = tmp_path / "m.c"
    src.write_text("#include <math.h>\ndouble f(double x) { return exp(x); }\n")
    so = tmp_path / "m.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-fno-builtin", "-o", so, src, "-lm"],
                   check=True, capture_output=True)
    if os.confstr("CS_GNU_LIBC_VERSION") < "glibc 2.29":
        pytest.skip("this host's glibc is older than 2.29")
    return so


def test_verify_fails_a_tag_promising_less_than_the_binaries_need(tmp_path: Path) -> None:
    so = _libm_so(tmp_path)
    files = {"demo_ext/__init__.py": b"", "demo_ext/_m.so": so.read_bytes()}
    low = make_wheel(tmp_path / "low", tag="cp311-cp311-manylinux_2_28_x86_64", files=files)
    ok = make_wheel(tmp_path / "ok", tag="cp311-cp311-manylinux_2_31_x86_64", files=files)
    floor = wheel_floor(low)
    assert floor.policy == "manylinux_2_31"
    assert floor.set_by[0].version == "GLIBC_2.29" and "exp" in floor.set_by[0].symbols
    bad = verify_wheel(low, import_check=False, raise_on_failure=False, default_archs=(90,))
    check = bad.check("glibc")
    assert not check.ok
    assert "promises manylinux_2_28" in check.detail and "GLIBC_2.29" in check.detail
    assert bad.as_dict()["floor"]["policy"] == "manylinux_2_31"
    good = verify_wheel(ok, import_check=False, raise_on_failure=False, default_archs=(90,))
    assert good.check("glibc").ok


# -- planning the floor before compiling ----------------------------------------------------
def test_a_newer_builder_reaches_the_floor_through_the_sysroot() -> None:
    plan = plan_floor("2_28", builder=(2, 36), sysroot="bullseye", where="image x")
    assert plan.sysroot and plan.linked == (2, 31) and plan.checked
    assert "bullseye sysroot" in plan.describe()
    plan = plan_floor("2_31", builder=(2, 36), sysroot="bullseye", where="image x")
    assert plan.sysroot and not plan.checked  # 2.31 holds by construction
    plan = plan_floor("2_28", builder=(2, 28), sysroot="bullseye", where="image manylinux")
    assert not plan.sysroot and plan.linked == (2, 28)
    plan = plan_floor("auto", builder=(2, 39), sysroot="bullseye", where="this host")
    assert plan.promised is None and not plan.sysroot


def test_an_unreachable_floor_fails_before_compiling() -> None:
    with pytest.raises(ToolchainError,
                       match="not reachable: this host links against glibc 2.39") as info:
        plan_floor("2_28", builder=(2, 39), sysroot="none", where="this host")
    assert "sysroot" in (info.value.tip or "")
    with pytest.raises(ToolchainError,
                       match="lowest floor the factory builds for is manylinux_2_28"):
        plan_floor("2_17", builder=(2, 36), sysroot="bullseye", where="image x")


def test_the_report_says_how_to_get_a_lower_floor() -> None:
    high = floor_of([_need("GLIBC_2.34", "libc.so.6", "__pthread_key_create")], files=1)
    tip = lower_floor_tip(high, plan_floor("auto", builder=(2, 39), sysroot="none", where="h"))
    assert tip is not None and 'manylinux = "2_28"' in tip and "sysroot" in tip
    low = floor_of([_need("GLIBC_2.14")], files=1)
    assert lower_floor_tip(low, plan_floor("2_28", builder=(2, 36), sysroot="bullseye",
                                           where="h")) is None


# -- the matrix names the floor -------------------------------------------------------------
def _matrix(settings: str = "", package: str = "", rules: str = ""):  # type: ignore[no-untyped-def]
    """The example matrix (conftest's) with extra settings, package keys and rules."""
    path = write_example_matrix(Path(tempfile.mkdtemp()) / "matrix.toml", work_dir=Path("work"))
    text = path.read_text().replace("[settings]\n", f"[settings]\n{settings}\n", 1)
    text = text.replace('recipe = "torch-extension"\n',
                        f'recipe = "torch-extension"\n{package}\n', 1)
    return load_matrix(text=text + "\n" + rules + "\n")


def test_the_floor_is_in_the_wheel_tag_and_the_content_key() -> None:
    default = _matrix().cells[0]
    assert default.manylinux == "2_28"
    assert default.wheel.endswith("-manylinux_2_28_x86_64.whl")
    other = _matrix(package='manylinux = "2.31"').cells[0]
    assert other.manylinux == "2_31" and other.wheel.endswith("-manylinux_2_31_x86_64.whl")
    assert other.cell.id == default.cell.id and other.content_key != default.content_key
    included = _matrix(rules='[[include]]\npackage = "factory-example-ext"\ntorch = "2.14.1"\n'
                             'cuda = "13.0"\narchs = ["9.0"]\npython = "3.11"\nmanylinux = "2_34"')
    by_arch = {pc.cell.archs: pc for pc in included.cells}
    assert by_arch[(90,)].manylinux == "2_34" and by_arch[(100,)].manylinux == "2_28"


def test_a_bad_floor_in_the_matrix_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"\[settings\] manylinux: no manylinux policy"):
        _matrix(settings='manylinux = "2_29"')
    with pytest.raises(ConfigError, match="sysroot 'buster' is not one of"):
        _matrix(settings='sysroot = "buster"')
    with pytest.raises(ConfigError, match="manylinux is not a cell axis"):
        _matrix(rules='[[exclude]]\nmanylinux = "2_28"')


# -- the sysroot tree -----------------------------------------------------------------------
def test_prune_keeps_headers_and_libraries_with_relative_links(tmp_path: Path) -> None:
    full = tmp_path / "full"
    libdir = full / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "libpthread.so.0").write_bytes(b"\x7fELF")
    (libdir / "libpthread.so").symlink_to("/lib/x86_64-linux-gnu/libpthread.so.0")
    (full / "lib").symlink_to("usr/lib")
    (full / "usr/include/c++/10").mkdir(parents=True)
    (full / "usr/include/stdio.h").write_text("")
    (full / "usr/lib/gcc/x86_64-linux-gnu/10").mkdir(parents=True)
    (full / "usr/lib/gcc/x86_64-linux-gnu/10/cc1plus").write_text("not needed")
    (full / "usr/bin").mkdir()
    (full / "usr/bin/perl").write_text("")
    lean = tmp_path / "lean"
    sysroot.prune(full, lean)
    link = lean / "usr/lib/x86_64-linux-gnu/libpthread.so"
    assert not os.readlink(link).startswith("/")  # never the builder's own glibc
    assert link.resolve() == (lean / "usr/lib/x86_64-linux-gnu/libpthread.so.0").resolve()
    assert (lean / "usr/include/stdio.h").exists() and not (lean / "usr/bin").exists()
    assert not (lean / "usr/lib/gcc/x86_64-linux-gnu/10/cc1plus").exists()
    # Debian's Python.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>: led to the builder's
    assert os.readlink(lean / "usr/include/x86_64-linux-gnu/python3.12") == (
        "/usr/include/x86_64-linux-gnu/python3.12")
    for driver in ("gcc", "g++"):
        wrapper = lean / "bin" / driver
        assert os.access(wrapper, os.X_OK)
        text = wrapper.read_text()
        assert "--sysroot=" in text and f"/usr/bin/{driver}" in text
        assert '-L"$sysroot/usr/lib/x86_64-linux-gnu"' in text  # libc from the sysroot
    env = sysroot.sysroot_env(lean, "/factory/sysroot")
    assert env["CXX"] == "/factory/sysroot/bin/g++" and env["LDSHARED"].startswith(
        "/factory/sysroot/bin/gcc -shared")
    assert sysroot.sysroot_env(None) == {}


def test_a_carried_tarball_that_is_no_sysroot_is_refused(tmp_path: Path) -> None:
    import tarfile

    bogus = tmp_path / "bogus.tar.gz"
    (tmp_path / "x").mkdir()
    with tarfile.open(bogus, "w:gz") as tf:
        tf.add(tmp_path / "x", arcname=".")
    from factory.errors import EngineError

    with pytest.raises(EngineError, match="not a factory sysroot"):
        sysroot.ensure_sysroot(tmp_path / "work", tarball=bogus)
