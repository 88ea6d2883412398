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
