"""Fixtures for the store/index/server tests: a real S3 API server (moto) on loopback, stores,
and a clean environment for pip and uv (no user or site configuration leaks in)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.store import Store, open_store

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class _SerialWrites:
    """moto checks If-Match / If-None-Match and then writes in two steps, so two threads can
    both pass the check; S3 itself does the pair atomically. Serializing moto's writes gives
    the tests S3's semantics, so they test our protocol and not moto's thread safety."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") in {"PUT", "POST", "DELETE"}:
            with self.lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = _SerialWrites(DomainDispatcherApplication(create_backend_app))
    yield from serve_in_thread(make_server("127.0.0.1", 0, app, threaded=True))


def serve_in_thread(server: Any) -> Iterator[str]:
    """Run a socketserver-style server in a thread; yields its URL (no trailing slash)."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def s3_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The variables a publisher (this process or a child) needs to reach the test S3."""
    env = {**S3_ENV, "FACTORY_S3_ENDPOINT_URL": moto_endpoint}
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_spec(s3_env: dict[str, str]) -> Iterator[str]:
    """A fresh bucket per test; ``s3://bucket/prefix`` (a prefix, to test that path too)."""
    import boto3

    bucket = f"test-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3", endpoint_url=s3_env["FACTORY_S3_ENDPOINT_URL"], region_name="us-east-1"
    )
    client.create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/pkgs"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", ()):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)


@pytest.fixture(params=["local", "s3"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return str(request.getfixturevalue("s3_spec"))
    return str(tmp_path / "store")


@pytest.fixture
def store(store_spec: str) -> Store:
    return open_store(store_spec)


def installer_env(tmp: Path) -> dict[str, str]:
    """pip and uv see only what the test gives them: no config files, no caches, no indexes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(tmp / "uv-cache"),
        UV_PYTHON_DOWNLOADS="never",
    )
    return env


def uv_bin() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "factory", *args]


def write_htpasswd(path: Path, user: str, password: str, *, cost: int = 4) -> Path:
    """An htpasswd file with one bcrypt user, as `htpasswd -B` writes it (cost 4: fast tests)."""
    from factory.index.htpasswd import bcrypt_line

    path.write_text(bcrypt_line(user, password, cost=cost) + "\n")
    return path


def multipart_upload(
    filename: str, content: bytes, boundary: str = "b0undary", **fields: str
) -> bytes:
    """The body twine sends: ':action=file_upload' and the other fields, then the file as
    'content' (``filename`` as given, even when it is hostile)."""
    form = {":action": "file_upload", "protocol_version": "1", **fields}
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in form.items()
    )
    body += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="content"; '
        f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode("utf-8", "surrogateescape")
    return body + content + f"\r\n--{boundary}--\r\n".encode()


def peak_rss(pid: int) -> int:
    """A live process's peak resident memory so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")
