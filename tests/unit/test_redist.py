"""CUDA 12.x toolkits from NVIDIA's redistributable archives (factory image cuda X.Y), against a
tiny fake redist tree made here: the manifest redistrib_X.Y.Z.json and one .tar.xz per
component under <component>/linux-x86_64/, read from a mirror directory or over HTTP."""

from __future__ import annotations

import functools
import http.server
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_fixtures import serving
from redist_fixtures import make_mirror

from factory import logger
from factory.errors import ToolchainError
from factory.toolchain import download, redist


def test_a_toolkit_from_a_mirror_dir_has_nvcc_headers_and_lib64(tmp_path: Path) -> None:
    mirror = make_mirror(tmp_path / "mirror")
    make_mirror(tmp_path / "mirror", "12.8.0")  # an older release beside it: the newest wins
    make_mirror(tmp_path / "mirror", "12.9.0")  # another minor: not this one
    lines: list[str] = []
    home = redist.fetch_toolkit(
        "12.8", tmp_path / "toolkits", source=str(mirror), echo=lines.append
    )
    assert home == tmp_path / "toolkits" / "cuda-12.8"
    assert (home / "bin" / "nvcc").stat().st_mode & 0o111
    assert (home / "nvvm" / "bin" / "cicc").is_file()
    assert (home / "lib64" / "libcudart.so.12").is_file()  # lib64 -> lib, as torch links
    assert (home / "include" / "libcublas.h").is_file()  # header-only component: headers...
    assert not (home / "lib" / "libcublas.so.12").exists()  # ...and not its libraries
    assert "redist 12.8.1" in (home / ".factory-toolkit").read_text()
    assert len(lines) == len(redist.COMPONENTS) + len(redist.HEADER_ONLY)
    from factory.toolchain.resolve import nvcc_version

    assert str(nvcc_version(home / "bin" / "nvcc")) == "12.8"
    # made once: a second call reads nothing
    assert (
        redist.fetch_toolkit("12.8", tmp_path / "toolkits", source=str(tmp_path / "gone")) == home
    )


def test_an_archive_that_does_not_match_the_manifest_is_refused(tmp_path: Path) -> None:
    mirror = make_mirror(tmp_path / "mirror", corrupt="cuda_cccl")
    with pytest.raises(ToolchainError, match="sha256 mismatch for cuda_cccl/linux-x86_64/"):
        redist.fetch_toolkit("12.8", tmp_path / "toolkits", source=str(mirror), echo=lambda _: None)
    assert not (tmp_path / "toolkits" / "cuda-12.8").exists()


@pytest.mark.parametrize(
    ("drop", "cuda", "expected"),
    [
        ("cuda_nvrtc", "12.8", "has no cuda_nvrtc for linux-x86_64"),
        (None, "12.6", "no redistrib_12.6.*.json manifest"),
    ],
)
def test_a_missing_component_or_release_is_one_line(
    tmp_path: Path, drop: str | None, cuda: str, expected: str
) -> None:
    mirror = make_mirror(tmp_path / "mirror", drop=drop)
    with pytest.raises(ToolchainError, match=expected):
        redist.fetch_toolkit(cuda, tmp_path / "toolkits", source=str(mirror), echo=lambda _: None)


@pytest.fixture
def served_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The fake tree over HTTP, with a directory listing as NVIDIA's server has."""
    monkeypatch.setattr(http.server.SimpleHTTPRequestHandler, "log_message", lambda *a: None)
    root = make_mirror(tmp_path / "served")
    with serving(
        functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    ) as url:
        yield url


def test_a_toolkit_over_http(
    served_mirror: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = redist.fetch_toolkit(
        "12.8", tmp_path / "toolkits", source=served_mirror, echo=lambda _: None
    )
    assert (home / "bin" / "nvcc").is_file() and (home / "include" / "cuda_cccl.h").is_file()


def test_each_archive_over_http_shows_its_bytes(
    served_mirror: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(download, "QUIET_SECONDS", 0.0)  # the fake's archives come at once
    logger.configure()
    redist.fetch_toolkit("12.8", tmp_path / "toolkits", source=served_mirror, echo=lambda _: None)
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()]
    shown = {line.split(": ")[0] for line in lines if " (100 %), " in line}
    assert shown == {f"{c}-linux-x86_64-12.8.93-archive.tar.xz"
                     for c in (*redist.COMPONENTS, *redist.HEADER_ONLY)}
    assert not any("redistrib_" in line for line in lines)  # the manifest: no progress line


def test_the_archives_are_those_of_the_builders_cpu(tmp_path: Path) -> None:
    """The toolkit runs on the builder: an aarch64 builder (Grace) takes NVIDIA's linux-sbsa
    archives, an x86_64 one linux-x86_64; a manifest without the builder's CPU is one line."""
    both = make_mirror(tmp_path / "both", platforms=("linux-x86_64", "linux-sbsa"))
    for builder, plat in (("x86_64", "linux-x86_64"), ("aarch64", "linux-sbsa")):
        release = redist.find_release("12.8", str(both), builder=builder)
        assert {a.relative_path.split("/")[1] for a in release.archives} == {plat}
    x86_only = make_mirror(tmp_path / "x86")
    with pytest.raises(ToolchainError, match="has no cuda_nvcc for linux-sbsa$"):
        redist.find_release("12.8", str(x86_only), builder="aarch64")
