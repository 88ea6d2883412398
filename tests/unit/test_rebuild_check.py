"""Comparing two builds of one wheel (factory rebuild-check): identical bytes pass; otherwise
each differing member is named with the reason the bytes show."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from factory.wheels.compare import compare_wheels


def _wheel(
    path: Path, members: dict[str, bytes], *, when: tuple[int, ...] = (1980, 1, 1, 0, 0, 0)
) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=when), data)  # type: ignore[arg-type]
    return path


def _elf(fatbin: bytes) -> bytes:
    """A minimal 64-bit ELF with .text and .nv_fatbin sections."""
    import struct

    shstr = b"\0.text\0.nv_fatbin\0.shstrtab\0"
    text = b"\x90" * 16
    body = text + fatbin + shstr
    shoff = 64 + len(body)
    header = (
        b"\x7fELF\x02\x01\x01"
        + b"\0" * 9
        + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 4, 3)
    )

    def sh(name: int, typ: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, 1, 0)

    sections = (
        sh(0, 0, 0, 0)
        + sh(1, 1, 64, len(text))
        + sh(7, 1, 64 + len(text), len(fatbin))
        + sh(18, 3, 64 + len(text) + len(fatbin), len(shstr))
    )
    return header + body + sections


def test_identical_wheels_have_no_differences(tmp_path: Path) -> None:
    members = {"pkg/_C.so": _elf(b"A" * 32), "pkg-1.dist-info/RECORD": b"r"}
    a = _wheel(tmp_path / "a.whl", members)
    b = _wheel(tmp_path / "b.whl", members)
    assert a.read_bytes() == b.read_bytes() and compare_wheels(a, b) == ()


def test_differences_are_named_with_their_reason(tmp_path: Path) -> None:
    a = _wheel(
        tmp_path / "a.whl",
        {
            "pkg/_C.so": _elf(b"A" * 32),
            "pkg/x.py": b"x",
            "pkg/old.py": b"",
            "pkg-1.dist-info/RECORD": b"r1",
        },
    )
    b = _wheel(
        tmp_path / "b.whl",
        {
            "pkg/_C.so": _elf(b"B" * 32),
            "pkg/x.py": b"x",
            "pkg-1.dist-info/RECORD": b"r2",
            "pkg/new.py": b"",
        },
    )
    diffs = {d.name: d.why for d in compare_wheels(a, b)}
    assert diffs["pkg/_C.so"].startswith("ELF sections .nv_fatbin differ: the CUDA fatbinary")
    assert diffs["pkg/old.py"] == "only in the first wheel"
    assert diffs["pkg/new.py"] == "only in the second wheel"
    assert diffs["pkg-1.dist-info/RECORD"].startswith("RECORD lists the hashes")
    assert "pkg/x.py" not in diffs


def test_zip_times_alone_are_named(tmp_path: Path) -> None:
    a = _wheel(tmp_path / "a.whl", {"m.py": b"x"})
    b = _wheel(tmp_path / "b.whl", {"m.py": b"x"}, when=(2026, 12, 1, 0, 0, 0))
    (diff,) = compare_wheels(a, b)
    assert diff.name == "m.py" and "SOURCE_DATE_EPOCH" in diff.why


def test_rebuild_check_needs_a_published_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from factory.cli import main
    from factory.errors import CellError

    (tmp_path / "store").mkdir()
    rc = main(
        [
            "rebuild-check",
            "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311",
            "--store",
            str(tmp_path / "store"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == CellError.exit_code
    assert "factory_example_ext-0.1.0+cu130torch2.14sm100" in err and "is not published in" in err


def test_cache_clear_minds_only_builds_that_use_this_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from factory.commands import cache
    from factory.runners import engine

    ours, other = tmp_path / "cache", tmp_path / "other-cache"
    containers = [
        SimpleNamespace(name="theirs", attrs={"Mounts": [{"Source": str(other)}]}),
        SimpleNamespace(name="no-cache", attrs={"Mounts": []}),
        SimpleNamespace(name="mine", attrs={"Mounts": [{"Source": str(ours)}]}),
    ]
    client = SimpleNamespace(containers=SimpleNamespace(list=lambda filters: containers))
    monkeypatch.setattr(engine, "docker_client", lambda timeout: client)
    assert cache._running_builds(ours) == ["mine"]
    assert cache._running_builds(tmp_path / "unused") == []
