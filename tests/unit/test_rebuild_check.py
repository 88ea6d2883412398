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


def _elf(fatbin: bytes, *, text: bytes = b"\x90" * 16, strtab: bytes = b"\0") -> bytes:
    """A minimal 64-bit ELF: .text, .nv_fatbin, .strtab (local symbol names), .shstrtab."""
    import struct

    contents = [(b".text", 1, text), (b".nv_fatbin", 1, fatbin), (b".strtab", 3, strtab)]
    shstr = b"\0" + b"".join(name + b"\0" for name, _, _ in contents) + b".shstrtab\0"
    contents.append((b".shstrtab", 3, shstr))
    body, headers, offset, name_at = b"", [struct.pack("<IIQQQQIIQQ", *[0] * 10)], 64, 1
    for name, typ, data in contents:
        headers.append(
            struct.pack("<IIQQQQIIQQ", name_at, typ, 0, 0, offset, len(data), 0, 0, 1, 0)
        )
        body, offset, name_at = body + data, offset + len(data), name_at + len(name) + 1
    header = (
        b"\x7fELF\x02\x01\x01"
        + b"\0" * 9
        + struct.pack(
            "<HHIQQQIHHHHHH",
            3,
            62,
            1,
            0,
            0,
            offset,
            0,
            64,
            0,
            0,
            64,
            len(headers),
            len(headers) - 1,
        )
    )
    return header + body + b"".join(headers)


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

    ours, other = tmp_path / "cache", tmp_path / "other-cache"
    containers = [
        SimpleNamespace(name="theirs", attrs={"Mounts": [{"Source": str(other)}]}),
        SimpleNamespace(name="no-cache", attrs={"Mounts": []}),
        SimpleNamespace(name="mine", attrs={"Mounts": [{"Source": str(ours)}]}),
    ]
    client = SimpleNamespace(containers=SimpleNamespace(list=lambda filters: containers))
    monkeypatch.setattr(cache, "docker_client", lambda timeout: client)
    assert cache._running_builds(ours) == ["mine"]
    assert cache._running_builds(tmp_path / "unused") == []


def test_nvcc_temp_names_in_symbol_names_are_made_constant() -> None:
    """nvcc's tmpxft_<pid>_<n> names reach the local symbols: the only bytes two builds of one
    source differ in. Repair makes them constant there, and only there."""
    from factory.wheels.compare import _why_content
    from factory.wheels.finalize import normalize_nvcc_temp_names

    def build(pid: bytes) -> bytes:
        name = b"_GLOBAL__sub_I_tmpxft_" + pid + b"_00000000_6_add.cudafe1.cpp"
        return _elf(b"F" * 8, text=b"tmpxft_" + pid + b"_00000001", strtab=b"\0" + name + b"\0")

    one, two = build(b"00000018"), build(b"0000004b")
    a, b = normalize_nvcc_temp_names(one), normalize_nvcc_temp_names(two)
    assert len(a) == len(one) and b"_GLOBAL__sub_I_tmpxft_00000000_00000000_6_add" in a
    assert b"tmpxft_00000018_00000001" in a  # outside the string tables: untouched
    assert _why_content(a, b).startswith("ELF sections .text differ")  # .strtab now equal
    assert _why_content(one, two).startswith("ELF sections .strtab, .text differ")
    assert "nvcc's temporary file names" in _why_content(one, two)
    assert normalize_nvcc_temp_names(b"not an ELF tmpxft_00000018_00000000") == (
        b"not an ELF tmpxft_00000018_00000000"
    )
