"""Verification before publish: archs read from the fatbin, tags and metadata, clean import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_fixtures import (
    make_wheel,
    py_wheel,
)

from factory.errors import EngineError, VerifyError, WheelError
from factory.wheels import binaries
from factory.wheels.binaries import find_cuobjdump, list_device_code
from factory.wheels.import_check import check_import
from factory.wheels.reader import analyse_wheel
from factory.wheels.verify import verify_wheel


def test_cuobjdump_is_found_in_the_installed_package() -> None:
    path = find_cuobjdump()
    assert path.name == "cuobjdump" and path.is_file()


def test_list_device_code_of_a_plain_library_is_empty() -> None:
    plain = Path(shutil.which("true") or "/bin/true")
    code = list_device_code(plain, "true", cuobjdump=find_cuobjdump())
    assert (code.sass, code.ptx) == ((), ())


def test_a_wheel_without_gpu_code_fails(tmp_path: Path) -> None:
    plain = make_wheel(
        tmp_path,
        files={
            "demo_ext/__init__.py": b"",
            "demo_ext/_k.so": Path(shutil.which("true") or "/bin/true").read_bytes(),
        },
    )
    report = verify_wheel(plain, import_check=False, raise_on_failure=False, default_archs=(90,))
    assert "no GPU code" in report.check("archs").detail


def test_an_unreadable_file_is_one_failed_check(tmp_path: Path) -> None:
    bad = tmp_path / "demo-0.1-cp311-cp311-manylinux_2_36_x86_64.whl"
    bad.write_bytes(b"garbage")
    with pytest.raises(VerifyError, match="not a readable zip") as exc:
        verify_wheel(bad)
    assert "\n" not in exc.value.message


def test_missing_cuobjdump_is_an_engine_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(binaries.importlib.metadata, "files", lambda name: [])
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError, match="cuobjdump not found"):
        find_cuobjdump()


def test_import_check_is_skipped_without_a_matching_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binaries.shutil, "which", lambda name: None)
    check = check_import(
        analyse_wheel(py_wheel(tmp_path, b"", tag="cp39-cp39-linux_x86_64")), wheelhouse=None
    )
    assert check.ok and check.skipped
    assert "the wheel is for cp39" in check.detail and "python3.9" in check.detail


def test_a_python_on_path_that_does_not_run_as_the_wheels_version_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pyenv shim for a version that is not selected is on PATH and exits 127 ("pyenv:
    python3.13: command not found"): the check said "creating a clean venv failed" and the
    build failed. Such an interpreter is not taken; one that runs as the version is."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python3.9"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.9: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    wheel = analyse_wheel(py_wheel(tmp_path, b"", tag="cp39-cp39-linux_x86_64"))
    check = check_import(wheel, wheelhouse=None)
    assert check.ok and check.skipped
    assert f"{shim} on PATH does not run as that version" in check.detail
    # one that runs as 3.9 is taken: its "venv" step passes, and the venv it did not make
    # has no python for pip
    shim.write_text("#!/bin/sh\necho cp39\n")
    with pytest.raises(EngineError, match=r"pip install: program .*/venv/bin/python"):
        check_import(wheel, wheelhouse=None)


def test_cli_verify_runs_as_a_program(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "factory",
            "verify",
            "--no-import",
            str(tmp_path / "nope-1.0-py3-none-any.whl"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == WheelError.exit_code  # a missing file, as for publish
    assert result.stderr.endswith("nope-1.0-py3-none-any.whl: no such file\n")
    assert result.stderr.startswith("ERROR") and "Traceback" not in result.stderr


