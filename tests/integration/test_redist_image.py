"""factory image cuda X.Y --from DIR: the CUDA 12.x builder image from a fake mirror of NVIDIA's
redist tree, on the session's base image (no network, no registry)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from redist_fixtures import make_mirror


@pytest.mark.docker
def test_factory_image_cuda_from_a_mirror(
    base_image: str, tmp_path: Path, docker_engine: Any
) -> None:
    """The whole command: a toolkit from the mirror dir, then an image on the base image whose
    nvcc on PATH is the toolkit's (no network, no registry)."""

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
