"""Raw wheel -> final wheel: analysis, tag, torch pin, RECORD, auditwheel repair, exact filename."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from wheel_fixtures import make_wheel, planned

from factory.errors import WheelError
from factory.wheels.finalize import finalize_wheel, rewrite_metadata
from factory.wheels.reader import analyse_wheel


def test_analyse_finds_top_level_modules_and_skips_vendored_libs(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": b"",
        "single.py": b"",
        "ext_cuda.cpython-311-x86_64-linux-gnu.so": b"\x7fELF",
        "pkg.libs/libfoo-1234.so.1": b"\x7fELF",
    }
    info = analyse_wheel(make_wheel(tmp_path, name="pkg", files=files))
    assert info.top_level == ("ext_cuda", "pkg", "single")
    assert info.extensions == (
        "ext_cuda.cpython-311-x86_64-linux-gnu.so",
        "pkg.libs/libfoo-1234.so.1",
    )


def test_analyse_reports_a_tampered_record(tmp_path: Path) -> None:
    info = analyse_wheel(
        make_wheel(tmp_path, files={"demo_ext/__init__.py": b"x = 1\n"}, break_record=True)
    )
    assert not info.record_ok
    assert "hash differs" in info.record_problems[0]


def test_analyse_reports_files_missing_from_record(tmp_path: Path) -> None:
    path = make_wheel(tmp_path, files={"demo_ext/__init__.py": b""})
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("demo_ext/extra.py", b"")
    assert analyse_wheel(path).record_problems == ("demo_ext/extra.py is not in RECORD",)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("demo-0.1-py3-none-any.zip", b"", "invalid wheel filename"),
        ("demo-0.1-py3-none-any.whl", b"not a zip", "not a readable zip"),
    ],
)
def test_analyse_refuses_what_is_not_a_wheel(
    tmp_path: Path, name: str, content: bytes, match: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(WheelError, match=match):
        analyse_wheel(path)


def test_analyse_refuses_a_wheel_without_dist_info(tmp_path: Path) -> None:
    path = tmp_path / "demo-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo/__init__.py", b"")
    with pytest.raises(WheelError, match="one .dist-info"):
        analyse_wheel(path)


# -- METADATA -------------------------------------------------------------------------------------
def test_rewrite_metadata_changes_only_version_and_torch() -> None:
    text = (
        "Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.8.3.post2\nLicense: BSD\n"
        "        folded line of the license\nRequires-Dist: torch\nRequires-Dist: einops\n"
        "Requires-Dist: torch>=2; extra == 'dev'\nRequires-Python: >=3.9\n"
        "\nVersion: in the body stays\n"
    )
    out = rewrite_metadata(
        text,
        version="2.8.3.post2+cu130torch2.14",
        drop_requirements=["torch"],
        add_requirement="torch==2.14.*",
    )
    assert out == (
        "Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.8.3.post2+cu130torch2.14\n"
        "License: BSD\n"
        "        folded line of the license\nRequires-Dist: einops\n"
        "Requires-Dist: torch>=2; extra == 'dev'\nRequires-Dist: torch==2.14.*\n"
        "Requires-Python: >=3.9\n"
        "\nVersion: in the body stays\n"
    )


def test_rewrite_metadata_without_a_body_keeps_the_pin_in_the_header() -> None:
    text = "Metadata-Version: 2.4\nName: demo\nVersion: 0.1.0\nDynamic: requires-python\n"
    out = rewrite_metadata(
        text, version="0.1.0+x", drop_requirements=[], add_requirement="torch==2.14.*"
    )
    assert out == (
        "Metadata-Version: 2.4\nName: demo\nVersion: 0.1.0+x\nDynamic: requires-python\n"
        "Requires-Dist: torch==2.14.*\n"
    )


def test_analyse_refuses_a_version_that_is_not_pep440(tmp_path: Path) -> None:
    path = make_wheel(tmp_path, files={"demo_ext/__init__.py": b""})
    bad = tmp_path / "bad" / path.name
    bad.parent.mkdir()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("METADATA"):
                data = data.replace(b"Version: 0.1.0", b"Version: one")
            dst.writestr(item, data)
    with pytest.raises(WheelError, match="not PEP 440"):
        analyse_wheel(bad)


def test_finalize_refuses_a_wheel_without_extension(tmp_path: Path) -> None:
    raw = make_wheel(tmp_path, files={"demo_ext/__init__.py": b""})
    with pytest.raises(WheelError, match="no compiled extension"):
        finalize_wheel(raw, planned(), tmp_path / "out")


