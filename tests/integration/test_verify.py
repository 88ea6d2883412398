"""Verification before publish: archs read from the fatbin, tags and metadata, clean import."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ExampleBuild
from wheel_fixtures import (
    WHEELHOUSE,
    compile_kernel_so,
    ext_wheel,
    make_wheel,
    planned,
    py_wheel,
)

from factory.cli import main
from factory.errors import VerifyError
from factory.wheels.binaries import find_cuobjdump, list_device_code
from factory.wheels.finalize import finalize_wheel
from factory.wheels.import_check import check_import
from factory.wheels.reader import analyse_wheel
from factory.wheels.verify import verify_wheel


@pytest.fixture(scope="module")
def sos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("so")
    return {
        "sm90": compile_kernel_so(d / "k90.so", "arch=compute_90,code=sm_90"),
        "sm90+ptx": compile_kernel_so(
            d / "k90ptx.so", "arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90"
        ),
        "ptx-only": compile_kernel_so(d / "ptx.so", "arch=compute_90,code=compute_90"),
        "sm90+sm100": compile_kernel_so(
            d / "k90_100.so", "arch=compute_90,code=sm_90", "arch=compute_100,code=sm_100"
        ),
    }


def _final(tmp_path: Path, so: Path, archs: tuple[int, ...]) -> tuple[Path, object]:
    """A finalized wheel holding ``so``, planned for ``archs`` (finalize does not read archs)."""
    pc = planned(archs=archs)
    return finalize_wheel(ext_wheel(tmp_path / "raw", so), pc, tmp_path / "out"), pc


def test_list_device_code_reads_sass_and_ptx(sos: dict[str, Path]) -> None:
    cuobjdump = find_cuobjdump()
    assert list_device_code(sos["sm90"], "k.so", cuobjdump=cuobjdump).sass == ("sm_90",)
    code = list_device_code(sos["sm90+ptx"], "k.so", cuobjdump=cuobjdump)
    assert (code.sass, code.ptx) == (("sm_90",), ("sm_90",))
    assert list_device_code(sos["sm90+sm100"], "k.so", cuobjdump=cuobjdump).sass_archs == {90, 100}


def test_a_good_wheel_passes_every_check(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, pc = _final(tmp_path, sos["sm90"], (90,))
    report = verify_wheel(wheel, expected=pc, import_check=False)  # type: ignore[arg-type]
    assert report.ok, report.summary()
    assert [c.name for c in report.checks] == [
        "filename",
        "metadata",
        "local-tag",
        "torch-pin",
        "platform",
        "record",
        "cpu",
        "archs",
        "glibc",
        "import",
    ]
    assert report.check("archs").detail == "SASS sm_90 in 1 file(s), no PTX"
    assert report.check("import").skipped


def test_wrong_arch_fails(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, pc = _final(tmp_path, sos["sm90"], (100,))
    report = verify_wheel(wheel, expected=pc, import_check=False, raise_on_failure=False)  # type: ignore[arg-type]
    assert [c.name for c in report.failures] == ["archs"]
    assert "has SASS sm_90, wanted sm_100" in report.check("archs").detail


def test_wrong_arch_fails_without_a_plan_too(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, _ = _final(tmp_path, sos["sm90"], (100,))  # the tag says sm100, the binary sm_90
    with pytest.raises(VerifyError, match="archs: .*has SASS sm_90, wanted sm_100"):
        verify_wheel(wheel, import_check=False)


def test_an_extra_arch_fails(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, pc = _final(tmp_path, sos["sm90+sm100"], (100,))
    report = verify_wheel(wheel, expected=pc, import_check=False, raise_on_failure=False)  # type: ignore[arg-type]
    assert not report.check("archs").ok
    wheel2, pc2 = _final(tmp_path / "both", sos["sm90+sm100"], (90, 100))
    assert verify_wheel(wheel2, expected=pc2, import_check=False).ok  # type: ignore[arg-type]


def test_ptx_fails_unless_allowed(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, pc = _final(tmp_path, sos["sm90+ptx"], (90,))
    report = verify_wheel(wheel, expected=pc, import_check=False, raise_on_failure=False)  # type: ignore[arg-type]
    assert [c.name for c in report.failures] == ["archs"]
    assert "carries PTX sm_90" in report.check("archs").detail
    assert verify_wheel(wheel, expected=pc, import_check=False, allow_ptx=True).ok  # type: ignore[arg-type]


def test_ptx_only_fails(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, pc = _final(tmp_path, sos["ptx-only"], (90,))
    report = verify_wheel(wheel, expected=pc, import_check=False, raise_on_failure=False)  # type: ignore[arg-type]
    detail = report.check("archs").detail
    assert "has SASS none, wanted sm_90" in detail and "carries PTX sm_90" in detail


def test_a_raw_wheel_fails_tag_pin_and_platform(tmp_path: Path, sos: dict[str, Path]) -> None:
    raw = ext_wheel(tmp_path, sos["sm90"], requires=["torch"])
    report = verify_wheel(raw, import_check=False, raise_on_failure=False, default_archs=(90,))
    failed = {c.name for c in report.failures}
    assert failed == {"local-tag", "torch-pin", "platform"}
    assert report.check("platform").detail == "not manylinux: linux_x86_64"


def test_a_tampered_wheel_fails_record(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, pc = _final(tmp_path, sos["sm90"], (90,))
    tampered = tmp_path / "t" / wheel.name
    tampered.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(
                item, b"VALUE = 666\n" if item.filename == "demo_ext/__init__.py" else data
            )
    report = verify_wheel(tampered, expected=pc, import_check=False, raise_on_failure=False)  # type: ignore[arg-type]
    assert [c.name for c in report.failures] == ["record"]
    assert "demo_ext/__init__.py: hash differs" in report.check("record").detail


def test_a_wheel_not_the_planned_one_fails(tmp_path: Path, sos: dict[str, Path]) -> None:
    wheel, _ = _final(tmp_path, sos["sm90"], (90,))
    other = planned(archs=(90,), version="0.2.0")
    report = verify_wheel(wheel, expected=other, import_check=False, raise_on_failure=False)
    assert "is not the planned demo_ext-0.2.0" in report.check("filename").detail


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the test wheels are tagged cp311")
def test_import_check_installs_into_a_clean_venv_and_imports(tmp_path: Path) -> None:
    check = check_import(analyse_wheel(py_wheel(tmp_path, b"VALUE = 1\n")), wheelhouse=None)
    assert check.ok and not check.skipped
    assert "imported demo_ext" in check.detail


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the test wheels are tagged cp311")
def test_import_check_fails_when_the_import_fails(tmp_path: Path) -> None:
    check = check_import(
        analyse_wheel(py_wheel(tmp_path, b"raise ImportError('boom: no libfoo')\n")),
        wheelhouse=None,
    )
    assert not check.ok
    assert "boom: no libfoo" in check.detail


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the test wheels are tagged cp311")
def test_import_check_fails_when_a_dependency_is_not_in_the_wheelhouse(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path, files={"demo_ext/__init__.py": b""}, requires=["factory-no-such-dist==1.0"]
    )
    check = check_import(analyse_wheel(wheel), wheelhouse=tmp_path / "empty-wheelhouse")
    assert not check.ok
    assert (
        "pip install --no-index failed" in check.detail and "factory-no-such-dist" in check.detail
    )


# -- the command ----------------------------------------------------------------------------------
def test_cli_verify_json_and_exit_codes(
    tmp_path: Path,
    sos: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no matrix.toml here: the wheel is checked on its own
    good, _ = _final(tmp_path / "g", sos["sm90"], (90,))
    bad, _ = _final(tmp_path / "b", sos["sm90+ptx"], (90,))
    assert main(["verify", "--no-import", "--json", str(good)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1 and out["wheels"][0]["ok"] is True
    assert main(["verify", "--no-import", str(good), str(bad)]) == VerifyError.exit_code
    captured = capsys.readouterr()
    assert "fail  archs" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR 1 of 2 wheel(s) failed verification")


# -- the real extension ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.docker
def test_the_real_example_wheel_verifies_with_a_clean_import(tmp_path: Path,
                                                             example_build: ExampleBuild) -> None:
    raw = example_build.raw  # the session's default build, before finalize
    pc = planned("factory-example-ext", archs=(100,))
    wheel = finalize_wheel(raw, pc, tmp_path)
    report = verify_wheel(wheel, expected=pc, wheelhouse=WHEELHOUSE)
    assert report.ok, report.summary()
    assert report.check("archs").detail == "SASS sm_100 in 1 file(s), no PTX"
    assert "torch 2.14.1" in report.check("import").detail
    # The same wheel planned for sm_90 must fail on archs.
    wrong = planned("factory-example-ext", archs=(90,))
    assert (
        not verify_wheel(wheel, expected=wrong, import_check=False, raise_on_failure=False)
        .check("archs")
        .ok
    )
