"""The offline base image (debootstrap + docker import) and the builder Dockerfile."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from factory.toolchain import images

REPO = Path(__file__).resolve().parents[2]


def _run_offline(client: Any, image: str, script: str) -> str:
    return str(client.containers.run(image, ["sh", "-c", script], network_disabled=True,
                                     remove=True).decode())


@pytest.mark.docker
def test_base_image_has_what_a_build_needs(docker_engine: Any, base_image: str) -> None:
    script = ("python3 -c 'import venv, sys; print(sys.version_info[:2])' && g++ --version"
              " && ccache --version")
    out = _run_offline(docker_engine, base_image, script)
    assert "(3, 11)" in out and "g++" in out and "ccache version" in out
    assert images.image_state(docker_engine, base_image) == "current"


@pytest.mark.docker
def test_second_call_is_fast_and_reimport_uses_the_cached_rootfs(
    docker_engine: Any, base_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_debootstrap(*a: Any, **k: Any) -> None:
        raise AssertionError("the image exists: nothing to make")

    monkeypatch.setattr(images, "_debootstrap_tarball", no_debootstrap)
    assert images.ensure_base_image(base_image) == base_image


@pytest.mark.docker
def test_builder_dockerfile_builds_offline_on_the_base(docker_engine: Any, base_image: str) -> None:
    tag = "factory-test-builder:bookworm"
    try:
        proc = subprocess.run(
            [
                "docker",
                "build",
                "--network",
                "none",
                "-q",
                "-f",
                str(REPO / "docker" / "Dockerfile"),
                "--build-arg",
                f"BASE={base_image}",
                "-t",
                tag,
                str(REPO / "docker"),
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = _run_offline(docker_engine, tag, "ls -d /factory/src /factory/cache && python3 -V")
        assert "/factory/src" in out and "Python 3.11" in out
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


@pytest.mark.docker
def test_a_python_image_without_its_cpython_is_made_again(
    docker_engine: Any, base_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Builds trust a factory-base:<suite>-py<X.Y> name to hold that CPython. An image of that
    name without the factory's CPython label (what `image base --name` once imported: the plain
    base) is built again, labelled, and trusted from then on. The CPython build script is
    replaced by `true` here (the real one takes about ten minutes); the container, the commit
    and the label are real."""
    from factory.cli import main
    from factory.toolchain import python_image

    name = "factory-base:bookworm-py3.11"
    if images.image_state(docker_engine, name) != "missing":
        pytest.skip(f"{name} exists on this engine: not replaced by a test")
    docker_engine.images.get(base_image).tag("factory-base", "bookworm-py3.11")
    try:
        assert images.image_label(docker_engine, name, python_image.PYTHON_LABEL) is None
        monkeypatch.setattr(python_image, "BUILD_SCRIPT", "true")
        assert main(["image", "base", "--name", name, "--work-dir", str(tmp_path)]) == 0
        assert images.image_label(docker_engine, name, python_image.PYTHON_LABEL) == "3.11"
        assert images.image_state(docker_engine, name) == "current"

        def no_build(*_: Any, **__: Any) -> str:
            raise AssertionError("the labelled image is used as it is")

        monkeypatch.setattr(python_image, "build_python_image", no_build)
        assert python_image.ensure_builder_image(name) == name
    finally:
        docker_engine.images.remove(name, force=True)
