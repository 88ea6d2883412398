"""The docker engine through the factory's one connection (factory/engine.py), with the docker SDK
this interpreter holds. .ci/floors runs it on the lowest SDK pyproject.toml allows: docker 7.0.0
cannot reach any engine once requests is 2.32 or newer ("Not supported URL scheme
http+docker"), 7.1.0 can. Whether an engine runs is asked of its socket directly, not of the
SDK, so an SDK that cannot reach a running engine fails here instead of passing as "no engine"
(the docker_engine fixture skips on any connection error)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from factory.engine import ENGINE_TIP, docker_client, image_exists
from factory.errors import EngineError

pytestmark = pytest.mark.integration


def _engine_socket() -> str | None:
    """The engine's unix socket when an engine answers its ping there (no SDK involved)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return None  # tcp:// or ssh://: the SDK test below is for the local engine
    path = host[len("unix://"):]
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status = sock.recv(64).split(b"\r\n", 1)[0].split()
    except OSError:
        return None
    return path if status[1:2] == [b"200"] else None


@pytest.mark.docker
def test_the_factorys_connection_reaches_the_running_engine() -> None:
    if _engine_socket() is None:
        pytest.skip("no docker engine answers on its socket")
    client = docker_client(timeout=30)
    assert client.ping() is True
    assert client.version()["ApiVersion"]
    assert image_exists(client, "factory-test-no-such-image:never") is False
    tagged = [tag for image in client.images.list() for tag in image.tags]
    if tagged:
        assert image_exists(client, tagged[0]) is True


def test_no_engine_is_one_engine_error_with_the_tip(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'none.sock'}")
    with pytest.raises(EngineError) as caught:
        docker_client(timeout=5)
    assert caught.value.message.startswith("the docker engine is not running or not reachable (")
    assert "\n" not in caught.value.message and caught.value.tip == ENGINE_TIP
