"""The container engine: one place that connects to docker and says clearly when it cannot."""

from __future__ import annotations

from typing import Any

from factory.errors import EngineError

ENGINE_TIP = (
    "start the docker engine (dockerd, or 'systemctl start docker'), "
    "or build without containers: --runner local"
)


def docker_client(*, timeout: int = 120) -> Any:
    """A connected ``docker.DockerClient``; EngineError (one line + tip) when there is none."""
    try:
        # heavy: the docker SDK, imported when used
        from docker.errors import DockerException

        import docker
    except ImportError:
        raise EngineError("the docker SDK is not installed", tip="pip install docker") from None
    try:
        client = docker.from_env(timeout=timeout)  # type: ignore[attr-defined]
        client.ping()
    except DockerException as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EngineError(
            f"the docker engine is not running or not reachable ({reason})", tip=ENGINE_TIP
        ) from None
    return client


def image_exists(client: Any, name: str) -> bool:
    # heavy: the docker SDK, imported when used
    from docker.errors import ImageNotFound

    try:
        client.images.get(name)
    except ImageNotFound:
        return False
    return True
