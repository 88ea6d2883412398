"""The offline base image (debootstrap + docker import) and the builder Dockerfile."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from factory.matrix.manylinux import plat_for_image
from factory.toolchain import images
from factory.toolchain.python_image import BUILD_SCRIPT
from factory.errors import EngineError

REPO = Path(__file__).resolve().parents[2]


def test_platform_follows_the_base_glibc() -> None:
    assert plat_for_image("factory-base:bookworm") == "manylinux_2_36_x86_64"
    assert (
        plat_for_image("quay.io/pypa/manylinux_2_28_x86_64:2025.01")
        == "manylinux_2_28_x86_64"
    )


def test_rootfs_cache_name_follows_the_package_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = images.rootfs_tarball(tmp_path, "bookworm")
    monkeypatch.setattr(images, "BASE_PACKAGES", (*images.BASE_PACKAGES, "cmake"))
    assert images.rootfs_tarball(tmp_path, "bookworm") != a


def test_script_and_module_share_the_package_list_and_cache_name() -> None:
    script = (REPO / "docker" / "make-base-image.sh").read_text()
    assert f'packages="{",".join(images.BASE_PACKAGES)}"' in script
    assert 'key="$(echo "$packages" | sha256sum | cut -c1-12)"' in script
    assert 'rootfs-$suite-$key.tar' in script
    assert f'label="{images.PACKAGES_LABEL}"' in script and 'LABEL $label=$key' in script


def test_packages_key_is_what_the_script_computes() -> None:
    line = ",".join(images.BASE_PACKAGES)
    out = subprocess.run(f'echo "{line}" | sha256sum | cut -c1-12', shell=True,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert images.packages_key() == out


class _FakeImages:
    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        self.labels = labels

    def get(self, name: str) -> Any:
        from docker.errors import ImageNotFound

        if name not in self.labels:
            raise ImageNotFound(name)
        return type("Image", (), {"attrs": {"Config": {"Labels": self.labels[name]}}})()


def test_image_state_reads_the_package_label() -> None:
    client = type("Client", (), {})()
    client.images = _FakeImages({
        "new": {images.PACKAGES_LABEL: images.packages_key()},
        "old": {images.PACKAGES_LABEL: "0123456789ab"},
        "unlabelled": {},
    })
    assert images.image_state(client, "new") == "current"
    assert images.image_state(client, "old") == "stale"
    assert images.image_state(client, "unlabelled") == "stale"
    assert images.image_state(client, "absent") == "missing"


def test_engine_down_is_one_line_with_a_tip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(EngineError) as info:
        images.ensure_base_image("factory-test-absent:1")
    assert "not running" in info.value.message and "\n" not in info.value.message
    assert info.value.tip


def test_debootstrap_missing_is_an_engine_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError, match="debootstrap") as info:
        images._debootstrap_tarball(tmp_path / "x.tar", suite="bookworm", mirror="http://invalid")
    assert info.value.tip == "apt-get install debootstrap"


def test_cuda_dockerfile_is_parameterised_by_cuda_version() -> None:
    text = (REPO / "docker" / "Dockerfile.cuda").read_text()
    assert "ARG CUDA=12.8" in text and "ARG BASE=quay.io/pypa/manylinux_2_28_x86_64" in text
    # the tag the toolchain gives the image source, and the packages torch extensions need
    assert "factory-cuda:" in text
    for pkg in (
        "cuda-nvcc-",
        "cuda-cudart-devel-",
        "cuda-cccl-",
        "libcublas-devel-",
        "libcusparse-devel-",
    ):
        assert pkg in text


@pytest.mark.parametrize(("suite_files", "python"), [
    (["python3.13_3.13.5.orig.tar.xz", "python3.13_3.13.5.orig.tar.xz.asc"], "3.13"),  # trixie
    (["python3.11_3.11.2.orig.tar.gz"], "3.11"),  # bookworm: no signature beside it
])
def test_the_cpython_build_unpacks_the_source_beside_its_signature(
    tmp_path: Path, suite_files: list[str], python: str
) -> None:
    """The image build's unpack step, as the script has it, on what `apt-get source` leaves:
    trixie's python3.13 has its .asc beside the tarball (a glob of both once failed with
    "tar: ...orig.tar.xz.asc: Not found in archive")."""
    script = BUILD_SCRIPT.format(mirror="M", source_suite="S", python=python)
    lines = script.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("apt-get source")) + 1
    end = next(i for i, x in enumerate(lines) if x.startswith("cd Python-"))
    src = tmp_path / f"Python-{python}.5"
    src.mkdir()
    (src / "configure").write_text("#!/bin/sh\n")
    for name in suite_files:
        if name.endswith(".asc"):
            (tmp_path / name).write_text("-----BEGIN PGP SIGNATURE-----\n")
        else:
            with tarfile.open(tmp_path / name, "w:xz" if name.endswith(".xz") else "w:gz") as t:
                t.add(src, arcname=src.name)
    shutil.rmtree(src)
    unpack = "set -eu\n" + "\n".join(lines[start:end + 1]) + "\nls configure\n"
    done = subprocess.run(["bash", "-c", unpack], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "configure"


@pytest.mark.skipif(shutil.which("mount") is None or __import__("os").geteuid() != 0,
                    reason="mounting needs root")
def test_a_proc_mount_debootstrap_left_in_the_root_is_unmounted(tmp_path: Path) -> None:
    # debootstrap mounts /proc in the target for its second stage and at times leaves it: the
    # tar of the root then read the host's live processes and failed (seen in CI)
    proc = tmp_path / "root dir" / "proc"
    proc.mkdir(parents=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)
    try:
        assert any(str(proc) in line.replace("\\040", " ")
                   for line in Path("/proc/mounts").read_text().splitlines())
        images._unmount_under(tmp_path / "root dir")
        assert not any(str(proc) in line.replace("\\040", " ")
                       for line in Path("/proc/mounts").read_text().splitlines())
        assert not (proc / "self").exists()
    finally:
        subprocess.run(["umount", "-l", str(proc)], capture_output=True)
