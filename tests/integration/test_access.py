"""Access: wrong upload credentials are refused and counted, reads can require credentials, no
credential reaches a log, an error line or the build container, and a build container has no
network (checked from inside one, against a host port a networked container does reach)."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import socket
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from index_fixtures import cli, write_htpasswd
from index_wheels import make_wheel, variant_wheel

from factory.cli import main
from factory.index.publish import publish
from factory.index.server import running_server
from factory.store import LocalStore

SECRET = f"planted-{uuid.uuid4().hex}"  # a password and a token no output may ever show
SECRET_B64 = base64.b64encode(f"uploader:{SECRET}".encode()).decode()


def _auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _request(url: str, *, data: bytes | None = None, auth: str | None = None,
             ctype: str | None = None) -> int:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if auth:
        req.add_header("Authorization", auth)
    if ctype:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


def _upload_body(wheel: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name=":action"\r\n\r\nfile_upload\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="content"; '
        f'filename="{wheel.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode() + wheel.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


@pytest.fixture
def htpasswd(tmp_path: Path) -> Path:
    return write_htpasswd(tmp_path / "htpasswd", "uploader", SECRET)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    publish(LocalStore(root), [variant_wheel(tmp_path / "w", "fa-demo", "1.0", "2.14")])
    return root


def test_wrong_upload_credentials_are_refused_and_counted(
    store_dir: Path, htpasswd: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """40 uploads with wrong or missing credentials at once: every one refused and counted,
    nothing stored, and no credential, right or wrong, in the server's log."""
    caplog.set_level(logging.DEBUG, logger="factory.index.server")
    wheel = make_wheel(tmp_path / "up", "intruder", "0.1")
    body, ctype = _upload_body(wheel)
    wrong = [None, _auth("uploader", SECRET + "x"), _auth("uploader", ""),
             _auth("nobody", SECRET), "Basic !!not-base64!!", "Bearer " + SECRET,
             _auth("uploader", SECRET.upper()), "Basic " + base64.b64encode(b"no-colon").decode()]
    with running_server(store_dir, htpasswd=htpasswd) as server:
        with ThreadPoolExecutor(max_workers=16) as pool:
            statuses = list(pool.map(
                lambda i: _request(server.url, data=body, auth=wrong[i % len(wrong)], ctype=ctype),
                range(40),
            ))
        assert sorted(set(statuses)) == [401, 403]
        assert statuses.count(401) == 5  # no credentials at all: asked for them
        assert server.stats.auth_failures == 40 and server.stats.uploads == 0
        assert not (store_dir / "files" / "intruder").exists()
        assert _request(server.url, data=body, auth=_auth("uploader", SECRET), ctype=ctype) == 200
        assert server.stats.uploads == 1 and server.stats.auth_failures == 40
    for secret in (SECRET, SECRET_B64, SECRET.upper()):
        assert secret not in caplog.text


def test_read_auth_counts_refusals(store_dir: Path, htpasswd: Path) -> None:
    with running_server(store_dir, htpasswd=htpasswd, read_auth=True) as server:
        paths = ["simple/", "simple/fa-demo/", "files/fa-demo/x.whl", "cu130-torch2.14/simple/"]
        assert [_request(server.url + p) for p in paths] == [401] * 4
        assert [_request(server.url + p, auth=_auth("uploader", "no")) for p in paths] == [403] * 4
        assert server.stats.auth_failures == 8
        assert _request(server.url + "simple/fa-demo/", auth=_auth("uploader", SECRET)) == 200


@pytest.mark.integration
def test_no_credential_in_the_log_of_factory_serve(store_dir: Path, htpasswd: Path,
                                                   tmp_path: Path) -> None:
    """The real command's log (stderr) after uploads and reads that carry the secret."""
    proc = subprocess.Popen(
        cli("serve", "--store", str(store_dir), "--port", "0", "--htpasswd", str(htpasswd),
            "--read-auth"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" at ", 1)[1].split()[0].removesuffix("simple/")
        body, ctype = _upload_body(make_wheel(tmp_path / "up", "logged", "1.0"))
        good, bad = _auth("uploader", SECRET), _auth("uploader", SECRET + "-wrong")
        assert _request(url, data=body, auth=good, ctype=ctype) == 200
        assert _request(url, data=body, auth=bad, ctype=ctype) == 403
        assert _request(url + f"simple/?token={SECRET}", auth=good) == 200
        assert _request(url + f"files/x/a.whl?sig={SECRET}", auth=bad) == 403
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=30)
    # the requests are in the log (Combined Log Format, the uploader named) ...
    assert ' - uploader [' in log and '"POST / HTTP/1.1" 200' in log
    assert '"GET /simple/ HTTP/1.1" 200' in log
    for secret in (SECRET, SECRET_B64):
        assert secret not in log  # ... no credential is


class _Refuses(BaseHTTPRequestHandler):
    """An S3 endpoint that refuses every request (403 AccessDenied) and keeps what it saw."""

    seen: list[str] = []

    def _deny(self) -> None:
        self.seen.append(f"{self.command} {self.path} {self.headers}")
        body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = _deny

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_no_credential_in_a_store_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 refusing the upload: the one-line error names the operation, not the keys, and the
    secret key itself never goes over the wire (SigV4 signs with it)."""
    import boto3

    access_key = "AKIA" + SECRET[-16:].upper()
    # boto3's default session keeps the first credentials it resolved: make a fresh one.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    wheel = make_wheel(tmp_path, "demo", "1.0")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("FACTORY_S3_ENDPOINT_URL", f"http://127.0.0.1:{server.server_port}")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["publish", "--store", "s3://bucket/prefix", str(wheel)])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert code != 0 and err.getvalue().startswith("ERROR ") and "AccessDenied" in err.getvalue()
    assert _Refuses.seen and access_key in "".join(_Refuses.seen)  # it did try, signed
    for text in (err.getvalue(), "".join(_Refuses.seen)):
        assert SECRET not in text
    assert access_key not in err.getvalue()


# -- the build container --------------------------------------------------------------------------
_PROBE_BACKEND = r'''
import os, socket, zipfile

def _probe():
    lines = []
    for target in os.environ["PROBE_TARGETS"].split(","):
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            lines.append("OPEN " + target)
        except OSError as exc:
            lines.append("BLOCKED " + target + " " + type(exc).__name__)
    try:
        socket.getaddrinfo("pypi.org", 443)
        lines.append("OPEN dns")
    except OSError as exc:
        lines.append("BLOCKED dns " + type(exc).__name__)
    return lines

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    lines = _probe()
    print("\n".join(lines), flush=True)
    for key, value in sorted(os.environ.items()):  # everything the build can see
        print(f"env {key}={value}", flush=True)
    name = "netprobe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        z.writestr("netprobe.txt", "\n".join(lines) + "\n")
        z.writestr("netprobe-0.1.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: netprobe\nVersion: 0.1\n")
        z.writestr("netprobe-0.1.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("netprobe-0.1.dist-info/RECORD", "")
    return name
'''

_GATEWAY = r'''
import os, socket, struct
for line in open("/proc/net/route").read().splitlines()[1:]:
    fields = line.split()
    if fields[1] == "00000000":
        gw = socket.inet_ntoa(struct.pack("<L", int(fields[2], 16)))
        try:
            socket.create_connection((gw, int(os.environ["PORT"])), timeout=5).close()
            print("OPEN", gw)
        except OSError as exc:
            print("BLOCKED", gw, exc)
'''


@contextlib.contextmanager
def _listener() -> Iterator[int]:
    """A TCP port on every host address that accepts and closes connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))  # noqa: S104 (the point: reachable from a container)
    sock.listen(16)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = sock.accept()
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        sock.close()


@pytest.mark.docker
def test_a_build_container_has_no_network_and_no_host_secrets(
    base_image: str, docker_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    no_leftover_containers: None, wheelhouse_cp311: Path,
) -> None:
    from factory.runners import BuildJob
    from factory.runners.docker import DockerRunner
    from factory.toolchain.wheelhouse import BUILD_FRONTEND_REQUIREMENT

    for name in ("AWS_SECRET_ACCESS_KEY", "TWINE_PASSWORD", "GITHUB_TOKEN", "FACTORY_TEST_SECRET"):
        monkeypatch.setenv(name, SECRET)
    with _listener() as port:
        # Control: a container on the default bridge reaches the port through its gateway.
        out = docker_engine.containers.run(
            base_image, ["python3", "-c", _GATEWAY], environment={"PORT": str(port)},
            network_mode="bridge", remove=True,
        ).decode()
        if not out.startswith("OPEN "):
            pytest.skip(f"a networked container cannot reach the host here either: {out!r}")
        gateway = out.split()[1]
        src = tmp_path / "src"
        src.mkdir()
        (src / "pyproject.toml").write_text(
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        )
        (src / "backend.py").write_text(_PROBE_BACKEND)
        job = BuildJob(
            cell_id="netprobe-0.1", python="3.11", image=base_image, src_dir=src,
            out_dir=tmp_path / "out", wheelhouse=wheelhouse_cp311, cuda_home=None,
            # the build frontend (pypa/build) from the session's wheelhouse, offline
            requirements=(BUILD_FRONTEND_REQUIREMENT,),
            env={"PROBE_TARGETS": f"{gateway}:{port},1.1.1.1:53,8.8.8.8:443"},
            memory_limit_bytes=1 << 30, cpus=1, pids_limit=256,
            log_path=tmp_path / "logs" / "build.log", venv_dir=tmp_path / "venv", timeout=600,
        )
        result = DockerRunner().run(job)
    log = result.log_path.read_text()
    assert result.exit_code == 0 and result.wheel is not None, log[-3000:]
    import zipfile

    with zipfile.ZipFile(result.wheel) as zf:
        probe = zf.read("netprobe.txt").decode().splitlines()
    assert len(probe) == 4 and all(line.startswith("BLOCKED ") for line in probe), probe
    assert f"BLOCKED {gateway}:{port}" in "\n".join(probe)
    assert "env PROBE_TARGETS=" in log  # the build printed its whole environment ...
    report = result.log_path.with_name(result.log_path.name + ".report.json")
    for text in (log, report.read_text() if report.exists() else "", json.dumps(
            DockerRunner(client=object()).describe(job))):
        assert SECRET not in text  # ... and no host secret was in it
    assert os.environ["FACTORY_TEST_SECRET"] == SECRET  # (it was set on the host)
