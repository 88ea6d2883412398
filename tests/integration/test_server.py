"""The embedded index server on loopback: negotiation, no fallback, uploads with credentials,
read auth, concurrency, and logs without secrets."""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
from index_fixtures import cli, multipart_upload, write_htpasswd
from index_wheels import make_wheel, variant_wheel
from tools import tool

from factory.index import verify_index
from factory.index.pages import JSON_TYPE
from factory.index.publish import publish
from factory.index.server import RunningServer, negotiate, running_server
from factory.store import LocalStore

PASSWORD = "s3cret-Pa55"  # noqa: S105 (a test credential)


def _get(
    url: str, accept: str | None = None, auth: tuple[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    if accept:
        request.add_header("Accept", accept)
    if auth:
        request.add_header(
            "Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _upload(
    url: str, wheel: Path, auth: tuple[str, str] | None, filename: str | None = None
) -> int:
    """What twine sends: a multipart form with :action=file_upload and the file as 'content'."""
    boundary = uuid.uuid4().hex
    body = multipart_upload(
        filename or wheel.name, wheel.read_bytes(), boundary, name="x", version="1"
    )
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
    if auth:
        request.add_header(
            "Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def htpasswd(tmp_path: Path) -> Path:
    return write_htpasswd(tmp_path / "htpasswd", "uploader", PASSWORD)


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    publish(
        LocalStore(root),
        [variant_wheel(tmp_path / "w", "fa-demo", "1.0", t) for t in ("2.13", "2.14")],
    )
    return root


@pytest.fixture
def server(populated: Path, htpasswd: Path) -> Iterator[RunningServer]:
    with running_server(populated, htpasswd=htpasswd) as running:
        yield running


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, "html"),
        ("text/html", "html"),
        ("application/vnd.pypi.simple.v1+json", "json"),
        (
            "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
            "text/html;q=0.01",
            "json",
        ),
        ("application/vnd.pypi.simple.v1+json;q=0.1, text/html", "html"),
        ("application/vnd.pypi.simple.latest+json", "json"),
        ("image/png", None),
    ],
)
def test_negotiate(accept: str | None, expected: str | None) -> None:
    assert negotiate(accept) == expected


def test_pages_are_negotiated(server: RunningServer) -> None:
    status, headers, body = _get(server.url + "simple/fa-demo/", accept=JSON_TYPE)
    assert status == 200 and headers["Content-Type"] == JSON_TYPE
    assert headers["Vary"] == "Accept, Accept-Encoding"  # pages are gzipped when asked
    assert {f["filename"] for f in json.loads(body)["files"]} == {
        "fa_demo-1.0+cu130torch2.13-py3-none-any.whl",
        "fa_demo-1.0+cu130torch2.14-py3-none-any.whl",
    }
    status, headers, body = _get(server.url + "simple/fa-demo/")
    assert (
        status == 200
        and headers["Content-Type"].startswith("text/html")
        and b"data-core-metadata" in body
    )
    assert _get(server.url + "simple/fa-demo/", accept="image/png")[0] == 406
    status, _, body = _get(server.url + "simple/fa-demo/?format=" + quote(JSON_TYPE))
    assert status == 200 and json.loads(body)["name"] == "fa-demo"


def test_per_variant_tree_holds_only_its_variant(server: RunningServer) -> None:
    _, _, body = _get(server.url + "cu130-torch2.13/simple/fa-demo/", accept=JSON_TYPE)
    assert [f["filename"] for f in json.loads(body)["files"]] == [
        "fa_demo-1.0+cu130torch2.13-py3-none-any.whl"
    ]
    assert _get(server.url + "cu130-torch2.9/simple/fa-demo/")[0] == 404
    assert _get(server.url)[0] == 200  # the landing page lists the variants


def test_unknown_names_are_404_with_no_fallback(server: RunningServer) -> None:
    for path in [
        "simple/requests/",
        "simple/numpy/",
        "cu130-torch2.14/simple/torch/",
        "nosuch/",
        "files/fa-demo/nothing.whl",
        "files/../../etc/passwd",
        "files/fa-demo/x.entry.json",
        "simple/fa-demo/extra/",
    ]:
        status, headers, _ = _get(server.url + path)
        assert status == 404, path
        assert "Location" not in headers
    assert server.stats.not_found == 8


def test_names_are_normalized_by_redirect(server: RunningServer) -> None:
    status, headers, _ = _get(server.url + "simple/Fa_Demo/")
    assert status == 301 and headers["Location"] == "/simple/fa-demo/"
    status, headers, _ = _get(server.url + "simple/fa-demo")
    assert status == 301 and headers["Location"] == "/simple/fa-demo/"


def test_files_and_metadata_are_served(server: RunningServer, populated: Path) -> None:
    name = "fa_demo-1.0%2Bcu130torch2.14-py3-none-any.whl"
    status, headers, body = _get(server.url + f"files/fa-demo/{name}")
    assert (
        status == 200
        and body
        == (populated / "files/fa-demo/fa_demo-1.0+cu130torch2.14-py3-none-any.whl").read_bytes()
    )
    assert "immutable" in headers["Cache-Control"]
    status, _, body = _get(server.url + f"files/fa-demo/{name}.metadata")
    assert status == 200 and b"Requires-Dist: torch==2.14.*" in body
    status, headers, body = _get(server.url + f"files/fa-demo/{name}", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_uploads_need_the_right_credentials(
    server: RunningServer, populated: Path, tmp_path: Path
) -> None:
    wheel = make_wheel(tmp_path / "up", "uploaded", "0.1")
    assert _upload(server.url, wheel, None) == 401
    assert _upload(server.url, wheel, ("uploader", "wrong")) == 403
    assert _upload(server.url + "legacy/", wheel, ("intruder", PASSWORD)) == 403
    assert server.stats.auth_failures == 3
    assert not (populated / "files" / "uploaded").exists()
    assert _upload(server.url, wheel, ("uploader", PASSWORD)) == 200
    assert _upload(server.url, wheel, ("uploader", PASSWORD)) == 200  # same bytes: fine
    other = make_wheel(tmp_path / "other", "uploaded", "0.1", requires=["numpy"])
    assert _upload(server.url, other, ("uploader", PASSWORD)) == 409
    assert _upload(server.url, wheel, ("uploader", PASSWORD), filename="../evil.whl") == 400
    assert _get(server.url + "simple/uploaded/")[0] == 200
    assert verify_index(LocalStore(populated)).ok


def test_twine_upload(server: RunningServer, tmp_path: Path) -> None:
    twine = tool("twine")
    wheel = make_wheel(tmp_path / "tw", "via-twine", "0.1")
    base = [
        twine,
        "upload",
        "--non-interactive",
        "--disable-progress-bar",
        "--repository-url",
        server.url,
    ]
    bad = subprocess.run(
        [*base, "-u", "uploader", "-p", "nope", str(wheel)], capture_output=True, text=True
    )
    assert bad.returncode != 0
    good = subprocess.run(
        [*base, "-u", "uploader", "-p", PASSWORD, str(wheel)], capture_output=True, text=True
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert _get(server.url + "simple/via-twine/")[0] == 200


def test_uploads_are_refused_without_an_htpasswd_file(populated: Path, tmp_path: Path) -> None:
    with running_server(populated) as running:
        assert _upload(running.url, make_wheel(tmp_path, "x", "1"), ("uploader", PASSWORD)) == 403
        assert _get(running.url + "simple/")[0] == 200


def test_read_auth(populated: Path, htpasswd: Path) -> None:
    with running_server(populated, htpasswd=htpasswd, read_auth=True) as running:
        assert _get(running.url + "simple/")[0] == 401
        assert _get(running.url + "simple/", auth=("uploader", "bad"))[0] == 403
        assert _get(running.url + "simple/fa-demo/", auth=("uploader", PASSWORD))[0] == 200


def test_credentials_never_reach_the_log(
    server: RunningServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="factory.index.server")
    wheel = make_wheel(tmp_path / "log", "logged", "1.0")
    assert _upload(server.url, wheel, ("uploader", PASSWORD)) == 200
    assert _upload(server.url, wheel, ("uploader", PASSWORD + "x")) == 403
    _get(server.url + "simple/?token=" + PASSWORD)
    text = caplog.text
    assert "POST /" in text and "GET /simple/" in text  # the requests are logged ...
    for secret in (PASSWORD, base64.b64encode(f"uploader:{PASSWORD}".encode()).decode()):
        assert secret not in text  # ... their credentials are not


@pytest.mark.integration
def test_200_concurrent_resolver_requests(server: RunningServer) -> None:
    paths = [
        "simple/",
        "simple/fa-demo/",
        "cu130-torch2.14/simple/fa-demo/",
        "files/fa-demo/fa_demo-1.0%2Bcu130torch2.13-py3-none-any.whl.metadata",
    ]
    start = threading.Barrier(200)

    def one(i: int) -> int:
        start.wait()
        return _get(server.url + paths[i % len(paths)], accept=JSON_TYPE if i % 2 else None)[0]

    with ThreadPoolExecutor(max_workers=200) as pool:
        statuses = list(pool.map(one, range(200)))
    assert statuses == [200] * 200
    assert server.stats.server_errors == 0


@pytest.mark.integration
def test_factory_serve_command(populated: Path) -> None:
    proc = subprocess.Popen(
        cli("serve", "--store", str(populated), "--port", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        url = first.split(" at ", 1)[1].split()[0]
        assert _get(url)[0] == 200
        assert _get(url.replace("simple/", "simple/unknown-project/"))[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


@pytest.mark.integration
def test_factory_serve_workers_share_the_port_and_end_with_it(populated: Path) -> None:
    proc = subprocess.Popen(
        cli("serve", "--store", str(populated), "--port", "0", "--workers", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" at ", 1)[1].split()[0]
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not workers.read_text().split():
            time.sleep(0.05)
        [worker] = [int(pid) for pid in workers.read_text().split()]
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda _: _get(url)[0], range(40)))
        assert statuses == [200] * 40
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0  # the first process ends its workers on SIGTERM
        if proc.stdout:
            proc.stdout.close()
    assert not Path(f"/proc/{worker}").exists()  # waited for, not left serving the port
