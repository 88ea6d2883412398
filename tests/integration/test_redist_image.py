"""factory image cuda X.Y --from DIR: the CUDA 12.x builder image from a fake mirror of NVIDIA's
redist tree, on the session's base image (no network, no registry), made by following the
command that ``factory matrix`` prints for the cell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redist_fixtures import make_mirror

OFFLINE = " (offline: --from MIRROR-DIR)"


def _factory(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "factory", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.docker
def test_the_printed_command_makes_the_image_that_builds_the_cell(
    base_image: str, tmp_path: Path, docker_engine: Any
) -> None:
    """The cell's toolchain is missing; the command ``factory matrix`` names for it (plus the
    mirror) makes an image with the toolkit's nvcc on PATH and the cell's Python, under the
    name builds use, and the matrix then shows the toolchain here."""
    from docker.errors import ImageNotFound

    mirror = make_mirror(tmp_path / "mirror")
    (tmp_path / "matrix.toml").write_text(
        f'version = 1\n[settings]\nwork-dir = "{tmp_path / "cache" / "work"}"\n'
        f'base-image = "{base_image}"\n'
        '[axes]\ntorch = ["2.10.0"]\ncuda = ["12.8"]\narchs = [["10.0"]]\npython = ["3.11"]\n'
        '[packages.flash-attn]\nrecipe = "flash-attn"\nversions = ["2.8.3.post2"]\n'
    )
    name = "factory-cuda:12.8-py3.11"
    try:
        docker_engine.images.get(name)
        pytest.skip(f"{name} exists on this host: the test makes and removes it")
    except ImageNotFound:
        pass
    try:
        r = _factory(tmp_path, "matrix")
        assert r.returncode == 0, r.stderr
        command = r.stdout.split("make it: ", 1)[1].splitlines()[0]
        assert command == f"factory image cuda 12.8 --python 3.11{OFFLINE}"
        argv = command.removesuffix(OFFLINE).split()[1:]
        r = _factory(tmp_path, *argv, "--from", str(mirror))
        assert r.returncode == 0, r.stderr
        assert f"image {name} ready (CUDA 12.8 on {base_image} for Python 3.11" in r.stdout
        assert (tmp_path / "cache" / "toolkits" / "cuda-12.8" / "bin" / "nvcc").is_file()
        r = _factory(tmp_path, "matrix")
        assert f"here      here: CUDA 12.8 in image {name}" in r.stdout
        out = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", name, "sh", "-c",
             "nvcc --version; echo CUDA_HOME=$CUDA_HOME; python3.11 -c 'print(\"python ok\")'"],
            capture_output=True, text=True, timeout=120,
        )
        assert "release 12.8, V12.8.93" in out.stdout
        assert "CUDA_HOME=/usr/local/cuda-12.8" in out.stdout
        assert "python ok" in out.stdout
    finally:
        subprocess.run(["docker", "rmi", "-f", name], capture_output=True)


@pytest.mark.docker
def test_a_base_the_name_says_nothing_about_is_run_for_its_python(
    base_image: str, docker_engine: Any
) -> None:
    """An image of the user's (a name the factory does not know) is asked for python3.X itself."""
    import uuid

    from factory.errors import ToolchainError
    from factory.toolchain.python_image import check_image_python, image_pythons

    repo, tag = "factory-test-userbase", uuid.uuid4().hex[:8]
    docker_engine.images.get(base_image).tag(repo, tag)
    name = f"{repo}:{tag}"
    try:
        assert image_pythons(name) is None
        check_image_python(name, "3.11")  # Debian 12's python3.11 is there
        with pytest.raises(ToolchainError, match=f"{name} has no python3.12"):
            check_image_python(name, "3.12")
        check_image_python(name, "3.12", run_image=False)  # the name alone tells nothing
    finally:
        docker_engine.images.remove(name)
