"""Unpacking on Pythons without tarfile's extraction filters (Debian 12's 3.11.2, Ubuntu 22.04's
3.10 before 3.10.12): the same refusals as the 'data' filter, before anything is written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from factory import tarsafe


def _tar(path: Path, members: list[tuple[str, bytes | None, str | None]]) -> Path:
    """(name, file data or None, symlink target or None) per member."""
    with tarfile.open(path, "w:gz") as tf:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tf.addfile(info)
            else:
                info.size, info.mode = len(data or b""), 0o4755
                tf.addfile(info, io.BytesIO(data or b""))
    return path


@pytest.fixture(params=[True, False], ids=["filters", "no-filters"])
def filters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param and not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no extraction filters")
    monkeypatch.setattr(tarsafe, "HAS_FILTERS", request.param)
    return bool(request.param)


def test_a_plain_archive_unpacks(tmp_path: Path, filters: bool) -> None:
    tar = _tar(tmp_path / "ok.tar.gz", [("pkg-1.0/setup.py", b"print(1)\n", None),
                                        ("pkg-1.0/link", None, "setup.py")])
    with tarfile.open(tar) as tf:
        tarsafe.extract(tf, tmp_path / "out")
    assert (tmp_path / "out/pkg-1.0/setup.py").read_text() == "print(1)\n"
    assert (tmp_path / "out/pkg-1.0/setup.py").stat().st_mode & 0o7000 == 0  # no setuid
    assert (tmp_path / "out/pkg-1.0/link").resolve() == (tmp_path / "out/pkg-1.0/setup.py")


@pytest.mark.parametrize("member", [
    ("../evil.py", b"x", None), ("pkg/up", None, "../../etc/passwd"),
])
def test_names_and_links_outside_the_destination_are_refused(
    tmp_path: Path, filters: bool, member: tuple[str, bytes | None, str | None]
) -> None:
    tar = _tar(tmp_path / "bad.tar.gz", [("pkg/ok.py", b"ok", None), member])
    with tarfile.open(tar) as tf, pytest.raises(tarfile.TarError):
        tarsafe.extract(tf, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()
    if not filters:  # checked before anything is written
        assert not (tmp_path / "out").exists()


def test_an_absolute_name_never_lands_outside(tmp_path: Path, filters: bool) -> None:
    """The 'data' filter strips the leading slash; without filters it is refused."""
    target = tmp_path / "abs-target" / "evil.py"
    tar = _tar(tmp_path / "abs.tar.gz", [(str(target), b"x", None)])
    with tarfile.open(tar) as tf:
        if filters:
            tarsafe.extract(tf, tmp_path / "out")
            assert (tmp_path / "out" / str(target).lstrip("/")).is_file()
        else:
            with pytest.raises(tarfile.TarError, match="outside the destination"):
                tarsafe.extract(tf, tmp_path / "out")
    assert not target.exists()
