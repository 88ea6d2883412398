"""CUDA 12.x toolkits from NVIDIA's redistributable archives (factory image cuda X.Y), against a
tiny fake redist tree made here: the manifest redistrib_X.Y.Z.json and one .tar.xz per
component under <component>/linux-x86_64/, read from a mirror directory or over HTTP."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import subprocess
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.errors import ToolchainError
from factory.toolchain import redist

NVCC = "#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n"


def _archive(component: str, version: str) -> bytes:
    """A tar.xz with NVIDIA's layout: one top dir <component>-linux-x86_64-<version>-archive."""
    top = f"{component}-linux-x86_64-{version}-archive"
    files = {f"{top}/include/{component}.h": b"/* header */\n", f"{top}/LICENSE": b"license\n"}
    if component == "cuda_nvcc":
        files[f"{top}/bin/nvcc"] = NVCC.encode()
        files[f"{top}/nvvm/bin/cicc"] = b"cicc\n"
    if component == "cuda_cudart":
        files[f"{top}/lib/libcudart.so.12"] = b"\x7fELF fake\n"
    if component.startswith("lib"):
        files[f"{top}/lib/{component}.so.12"] = b"big library, not wanted\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if "/bin/" in name else 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_mirror(
    root: Path, label: str = "12.8.1", *, corrupt: str | None = None, drop: str | None = None
) -> Path:
    manifest: dict[str, Any] = {"release_label": label, "release_product": "cuda"}
    for component in (*redist.COMPONENTS, *redist.HEADER_ONLY):
        if component == drop:
            continue
        version = "12.8.93"
        rel = f"{component}/linux-x86_64/{component}-linux-x86_64-{version}-archive.tar.xz"
        data = _archive(component, version)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data + (b"x" if component == corrupt else b""))
        manifest[component] = {
            "name": component,
            "version": version,
            "linux-x86_64": {
                "relative_path": rel,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": str(len(data)),
            },
        }
    (root / f"redistrib_{label}.json").write_text(json.dumps(manifest))
    return root


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
def served_mirror(tmp_path: Path) -> Iterator[str]:
    """The fake tree over HTTP, with a directory listing as NVIDIA's server has."""
    root = make_mirror(tmp_path / "served")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_a_toolkit_over_http(
    served_mirror: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http.server.SimpleHTTPRequestHandler, "log_message", lambda *a: None)
    home = redist.fetch_toolkit(
        "12.8", tmp_path / "toolkits", source=served_mirror, echo=lambda _: None
    )
    assert (home / "bin" / "nvcc").is_file() and (home / "include" / "cuda_cccl.h").is_file()


@pytest.mark.docker
@pytest.mark.integration
def test_factory_image_cuda_from_a_mirror(
    base_image: str, tmp_path: Path, docker_engine: Any
) -> None:
    """The whole command: a toolkit from the mirror dir, then an image on the base image whose
    nvcc on PATH is the toolkit's (no network, no registry)."""
    import sys

    mirror = make_mirror(tmp_path / "mirror")
    (tmp_path / "matrix.toml").write_text(
        f'version = 1\n[settings]\nwork-dir = "{tmp_path / "cache" / "work"}"\n'
        f'base-image = "{base_image}"\n'
        '[axes]\ntorch = ["2.14.1"]\ncuda = ["13.0"]\narchs = [["10.0"]]\npython = ["3.11"]\n'
        '[packages.flash-attn]\nrecipe = "flash-attn"\nversions = ["2.8.3.post2"]\n'
    )
    name = f"factory-cuda-test:{uuid.uuid4().hex[:8]}"
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "factory",
                "image",
                "cuda",
                "12.8",
                "--from",
                str(mirror),
                "--name",
                name,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        assert f"image {name} ready (CUDA 12.8 on {base_image}" in r.stdout
        assert (tmp_path / "cache" / "toolkits" / "cuda-12.8" / "bin" / "nvcc").is_file()
        out = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                name,
                "sh",
                "-c",
                "nvcc --version; echo CUDA_HOME=$CUDA_HOME",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (
            "release 12.8, V12.8.93" in out.stdout
            and "CUDA_HOME=/usr/local/cuda-12.8" in out.stdout
        )
    finally:
        subprocess.run(["docker", "rmi", "-f", name], capture_output=True)
