"""The index server under attack, on loopback: malformed requests (and a hypothesis fuzz of
request lines), the connection cap, uploads refused before their body is read or anything is
written, uploads streamed (server memory while a big wheel arrives), real curl uploads,
symlinks planted in the store, and writers' temp files."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import socket
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import cli, multipart_upload, peak_rss, write_htpasswd
from index_wheels import make_wheel, variant_wheel

from factory.index import rebuild_index, verify_index
from factory.index.publish import publish
from factory.index.server import RunningServer, running_server
from factory.store import LocalStore

PASSWORD = "s3cret-Pa55"  # noqa: S105 (a test credential)
TLS_CLIENT_HELLO = bytes.fromhex(
    "16030100c4010000c00303"
    + "ab" * 32
    + "00"
    + "0020"
    + "c02b" * 16
    + "0100"
    + "0073"
    + "00" * 115
)


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    publish(LocalStore(root), [variant_wheel(tmp_path / "w", "fa-demo", "1.0", "2.14")])
    return root


@pytest.fixture
def htpasswd(tmp_path: Path) -> Path:
    return write_htpasswd(tmp_path / "htpasswd", "uploader", PASSWORD)


@pytest.fixture
def server(populated: Path, htpasswd: Path) -> Iterator[RunningServer]:
    with running_server(populated, htpasswd=htpasswd) as running:
        yield running


def _raw(url: str, data: bytes, *, read_all: bool = True, timeout: float = 30) -> bytes:
    """Send bytes as they are; return what comes back until the server closes (or a timeout)."""
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if not read_all and b"\r\n\r\n" in b"".join(chunks):
                break
        return b"".join(chunks)


def _status(response: bytes) -> int:
    line = response.split(b"\r\n", 1)[0]
    assert line.startswith(b"HTTP/1."), response[:200]
    return int(line.split()[1])


def _auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


MALFORMED = {
    "HTTP/2.0 request line": (b"GET / HTTP/2.0\r\n\r\n", 400),
    "garbage": (b"GARBAGE\r\n\r\n", 400),
    "70k-character line": (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
    "TLS ClientHello": (TLS_CLIENT_HELLO, 400),
    "HTTP/0.9": (b"GET /\r\n", 400),
    "empty line": (b"\r\n\r\n", 400),
    "bad version": (b"GET / HTTP/1.x\r\n\r\n", 400),
    "four words": (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
    # found by the fuzz test: four words ending in HTTP/0.9 were answered with no status line
    "four words, HTTP/0.9": (b"\x00\t\x00\x85\x00\tHTTP/0.9\r\n\r\n", 400),
    "not an absolute path": (b"GET simple/ HTTP/1.1\r\n\r\n", 400),
    "control character": (b"GET /\x01x HTTP/1.1\r\n\r\n", 400),
    "too many headers": (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431),
    "header line too long": (b"GET / HTTP/1.1\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", 431),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_get_a_4xx_and_one_log_line(
    server: RunningServer, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="factory.index.server")
    data, expected = MALFORMED[case]
    assert _status(_raw(server.url, data)) == expected
    lines = [r for r in caplog.records if r.name == "factory.index.server"]
    assert len(lines) == 1 and f'" {expected}' in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text
    assert server.stats.handler_errors == 0 and server.stats.malformed == 1
    status = _status(_raw(server.url, b"GET /simple/ HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert status == 200  # and the server goes on serving


_LINE = st.binary(min_size=0, max_size=300).filter(lambda b: b"\r" not in b and b"\n" not in b)
_WORD = st.sampled_from([b"GET", b"HEAD", b"POST", b"PUT", b"G\x00T", b"get", b""])
_TARGET = st.one_of(
    st.sampled_from([b"/", b"/simple/", b"//x", b"*", b"http://x/", b"/files/../..", b"/%zz"]),
    st.binary(max_size=80).filter(lambda b: b"\r" not in b and b"\n" not in b),
)
_VERSION = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1", b""])


@pytest.mark.integration
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    line=st.one_of(
        _LINE,
        st.builds(lambda w, t, v: b" ".join(p for p in (w, t, v) if p), _WORD, _TARGET, _VERSION),
    )
)
def test_fuzzed_request_lines_always_get_an_answer_and_no_traceback(
    server: RunningServer, line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="factory.index.server")
    response = _raw(server.url, line + b"\r\nConnection: close\r\n\r\n", read_all=False)
    status = _status(response)
    assert 200 <= status < 600 and status != 500, (line, response[:200])
    assert server.stats.handler_errors == 0 and server.stats.server_errors == 0
    assert "Traceback" not in caplog.text


def _responses(data: bytes, heads: tuple[int, ...] = ()) -> list[tuple[int, dict[str, str], bytes]]:
    """Split what came back on one connection into (status, headers, body), in order;
    ``heads``: the positions of answers to HEAD (no body)."""
    out: list[tuple[int, dict[str, str], bytes]] = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        bodiless = lines[0].split()[1] == "304" or len(out) in heads
        length = 0 if bodiless else int(headers.get("Content-Length", 0))
        out.append((int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return out


@pytest.mark.integration
def test_pipelined_reads_then_a_request_for_the_handler_on_one_connection(
    server: RunningServer, populated: Path
) -> None:
    wheel = next((populated / "files" / "fa-demo").glob("*.whl")).name
    sent = (
        b"GET /simple/ HTTP/1.1\r\nHost: x\r\n\r\n"
        + f"GET /files/fa-demo/{wheel}.metadata HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        + f"HEAD /files/fa-demo/{wheel} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        + b"GET /simple/FA_Demo/ HTTP/1.1\r\nHost: x\r\n\r\n"  # a redirect: the handler's
        + b"GET /simple/fa-demo/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    answers = _responses(_raw(server.url, sent), heads=(2,))  # closed after the last one
    assert [status for status, _, _ in answers] == [200, 200, 200, 301, 200]
    assert answers[0][2] == (populated / "simple" / "index.html").read_bytes()
    metadata = populated / "files" / "fa-demo" / f"{wheel}.metadata"
    assert answers[1][2] == metadata.read_bytes()
    size = (populated / "files" / "fa-demo" / wheel).stat().st_size
    assert answers[2][1]["Content-Length"] == str(size) and answers[2][2] == b""
    assert answers[3][1]["Location"] == "/simple/fa-demo/"
    assert answers[4][2] == (populated / "simple" / "fa-demo" / "index.html").read_bytes()


@pytest.mark.integration
def test_the_read_loop_and_the_handler_answer_a_read_alike(
    server: RunningServer, populated: Path
) -> None:
    """HTTP/1.1 reads are the loop's, HTTP/1.0 ones the handler's: the same headers."""
    wheel = next((populated / "files" / "fa-demo").glob("*.whl")).name
    for path in ["/simple/fa-demo/", f"/files/fa-demo/{wheel}.metadata", f"/files/fa-demo/{wheel}"]:
        seen = []
        for version in ["HTTP/1.1", "HTTP/1.0"]:
            request = f"GET {path} {version}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
            [(status, headers, body)] = _responses(_raw(server.url, request.encode()))
            headers.pop("Date")
            seen.append((status, headers, body))
        assert seen[0] == seen[1], path


@pytest.mark.integration
def test_connections_past_the_cap_get_a_503(populated: Path) -> None:
    with running_server(populated, max_connections=4) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        try:
            deadline = time.monotonic() + 30
            response = b""
            while time.monotonic() < deadline:  # until the 4 idle ones hold every slot
                response = _raw(server.url, b"GET /simple/ HTTP/1.1\r\n\r\n")
                if response.startswith(b"HTTP/1.1 503"):
                    break
            assert _status(response) == 503 and b"Retry-After: 1" in response
            assert server.stats.busy >= 1
        finally:
            for s in idle:
                s.close()
        deadline = time.monotonic() + 30
        status = 503
        while status == 503 and time.monotonic() < deadline:  # slots come back as they close
            status = _status(
                _raw(server.url, b"GET /simple/ HTTP/1.1\r\nConnection: close\r\n\r\n")
            )
        assert status == 200


def _multipart(filename: str, content: bytes) -> bytes:
    return multipart_upload(filename, content, "b0undary")


def _post(url: str, body: bytes, auth: str | None, extra: bytes = b"") -> bytes:
    head = (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b0undary\r\n"
        + f"Content-Length: {len(body)}\r\n".encode()
        + (f"Authorization: {auth}\r\n".encode() if auth else b"")
        + extra
        + b"\r\n"
    )
    return _raw(url, head + body)


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".tmp-*"))


@pytest.mark.integration
def test_uploads_with_bad_names_or_wheels_are_400_and_write_nothing(
    server: RunningServer, populated: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="factory.index.server")
    wheel = make_wheel(tmp_path / "w", "uploaded", "0.1").read_bytes()
    auth = _auth("uploader", PASSWORD)
    before = sorted(p.name for p in (populated / "files").iterdir())
    for name in [
        "upl\0aded-0.1-py3-none-any.whl",
        "u" * 300 + "-0.1-py3-none-any.whl",
        "../uploaded-0.1-py3-none-any.whl",
        "uploaded-0.1-py3-none-bogus.whl",
    ]:
        response = _post(server.url, _multipart(name, wheel), auth)
        assert _status(response) == 400, name
    encrypted = tmp_path / "enc" / "uploaded-0.1-py3-none-any.whl"
    encrypted.parent.mkdir()
    encrypted.write_bytes(wheel)
    data = bytearray(encrypted.read_bytes())
    i = data.find(b"PK\x01\x02")
    data[i + 8] |= 1  # the first member's central directory entry: "encrypted"
    response = _post(server.url, _multipart(encrypted.name, bytes(data)), auth)
    assert _status(response) == 400 and b"encrypted" in response
    assert sorted(p.name for p in (populated / "files").iterdir()) == before
    assert _leftovers(populated) == []
    assert server.stats.server_errors == 0 and "Traceback" not in caplog.text


@pytest.mark.integration
def test_credentials_and_size_are_checked_before_the_body(populated: Path, htpasswd: Path) -> None:
    with running_server(populated, htpasswd=htpasswd, max_upload=10_000) as server:
        port = server.port
        for auth, expected in [
            (None, 401),
            (_auth("uploader", "wrong"), 403),
            (_auth("uploader", PASSWORD), 413),
        ]:
            head = (
                b"POST / HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: multipart/form-data; boundary=b0undary\r\n"
                b"Content-Length: 4000000000\r\n"
                + (f"Authorization: {auth}\r\n".encode() if auth else b"")
                + b"\r\n"
            )
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(head)  # and no body at all: the answer must not wait for it
                assert _status(s.recv(65536)) == expected
        assert _leftovers(populated) == []


def _curl() -> str:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    return curl


@pytest.mark.integration
def test_curl_upload_and_expect_100_continue(
    server: RunningServer, tmp_path: Path, populated: Path
) -> None:
    curl = _curl()
    wheel = make_wheel(tmp_path / "c", "via-curl", "0.1", payload_bytes=2 * 1024 * 1024)
    base = [
        curl,
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_upload}",
        "-H",
        "Expect: 100-continue",
        "-F",
        ":action=file_upload",
        "-F",
        f"content=@{wheel}",
    ]
    wrong = subprocess.run(
        [*base, "-u", "uploader:nope", server.url], capture_output=True, text=True, timeout=120
    )
    code, sent = wrong.stdout.split()
    assert code == "403" and int(sent) < wheel.stat().st_size  # refused before the body
    good = subprocess.run(
        [*base, "-u", f"uploader:{PASSWORD}", server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert good.stdout.split()[0] == "200", good.stdout + good.stderr
    assert (populated / "files" / "via-curl" / wheel.name).read_bytes() == wheel.read_bytes()
    assert verify_index(LocalStore(populated)).ok


@pytest.mark.integration
def test_a_big_upload_is_streamed_not_buffered(tmp_path: Path, htpasswd: Path) -> None:
    """The server's peak RSS stays under 100 MB while a 300 MB wheel arrives (curl)."""
    curl = _curl()
    store = tmp_path / "store"
    rebuild_index(LocalStore(store))
    wheel = make_wheel(tmp_path / "big", "big-one", "1.0", payload_bytes=300 * 1024 * 1024)
    proc = subprocess.Popen(
        cli("serve", "--store", str(store), "--port", "0", "--htpasswd", str(htpasswd)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" at ", 1)[1].split()[0].removesuffix("simple/")
        result = subprocess.run(
            [
                curl,
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-u",
                f"uploader:{PASSWORD}",
                "-F",
                ":action=file_upload",
                "-F",
                f"content=@{wheel}",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.stdout == "200", result.stdout + result.stderr
        peak = peak_rss(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    assert peak < 100 * 1024 * 1024, f"server peak RSS {peak / 2**20:.0f} MiB"
    assert (store / "files" / "big-one" / wheel.name).stat().st_size == wheel.stat().st_size
    assert _leftovers(store) == []


@pytest.mark.integration
def test_symlinks_in_the_store_are_never_followed(
    server: RunningServer, populated: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:secret\n")
    project = populated / "files" / "fa-demo"
    (project / "evil-1.0-py3-none-any.whl").symlink_to(secret)
    (populated / "files" / "linked").symlink_to(tmp_path)
    (populated / "simple" / "evil").mkdir()
    (populated / "simple" / "evil" / "index.html").symlink_to(secret)
    for path in [
        "files/fa-demo/evil-1.0-py3-none-any.whl",
        "files/linked/secret.txt",
        "files/linked/secret.txt.metadata",
        "simple/evil/",
    ]:
        response = _raw(server.url, f"GET /{path} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
        assert _status(response) == 404, path
        assert b"secret" not in response
    verdict = verify_index(LocalStore(populated))
    assert not verdict.ok
    assert sum("a symlink in the store" in p for p in verdict.problems) == 3
    result = subprocess.run(
        cli("index", "verify", "--store", str(populated)), capture_output=True, text=True
    )
    assert result.returncode == 15 and "files/linked: a symlink" in result.stdout


@pytest.mark.integration
def test_temp_files_are_reported_and_stale_ones_removed(populated: Path) -> None:
    project = populated / "files" / "fa-demo"
    stale = project / ".tmp-0123456789abcdef0123456789abcdef"
    stale.write_bytes(b"half a wheel")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    upload = populated / ".tmp-fedcba9876543210fedcba9876543210"
    upload.mkdir()
    (upload / "x-1.0-py3-none-any.whl").write_bytes(b"arriving")
    store = LocalStore(populated)
    verdict = verify_index(store)
    assert verdict.ok and len(verdict.temps) == 2
    shown = subprocess.run(
        cli("index", "verify", "--store", str(populated), "--json"), capture_output=True, text=True
    )
    assert shown.returncode == 0 and len(json.loads(shown.stdout)["temps"]) == 2
    result = subprocess.run(
        cli("index", "rebuild", "--store", str(populated)), capture_output=True, text=True
    )
    assert (
        result.returncode == 0
        and f"removed a stale temp file: {stale.relative_to(populated)}" in result.stdout
    )
    assert not stale.exists() and upload.exists()  # the young one may be a live upload
    assert rebuild_index(store, temp_grace=0).temps_removed == (upload.name,)
    assert verify_index(store).temps == ()


def test_a_stored_wheel_symlink_is_not_read(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    wheel = make_wheel(tmp_path / "w", "demo", "1.0")
    publish(store, [wheel])
    key = f"files/demo/{wheel.name}"
    target = store.path(key)
    target.unlink()
    target.symlink_to(wheel)
    with pytest.raises(Exception, match="cannot read"):
        store.read(key)
    with zipfile.ZipFile(wheel) as zf:
        assert zf.namelist()  # the target itself is fine; only the link is refused


@pytest.mark.integration
def test_an_upload_leaves_a_keep_alive_connection_usable(
    server: RunningServer, tmp_path: Path
) -> None:
    """The epilogue after the last multipart delimiter is read too, so the next request on the
    same connection is parsed from its first byte."""
    import http.client

    wheel = make_wheel(tmp_path / "k", "kept-alive", "0.1")
    body = _multipart(wheel.name, wheel.read_bytes())
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        headers = {
            "Content-Type": "multipart/form-data; boundary=b0undary",
            "Authorization": _auth("uploader", PASSWORD),
        }
        conn.request("POST", "/", body=body, headers=headers)
        first = conn.getresponse()
        assert first.status == 200 and first.read().startswith(b"published")
        conn.request("GET", "/simple/kept-alive/")
        second = conn.getresponse()
        assert second.status == 200 and wheel.name.encode() in second.read()
    finally:
        conn.close()
    assert server.stats.malformed == 0
