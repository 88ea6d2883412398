"""The index server against slow and strange clients, and at start: request heads and bodies
trickling in a byte at a time cannot hold the connection slots (they are dropped, logged once
per peer, and a normal client still gets its page), ``--workers`` keeps one cap for the whole
server, a Range of thousands of digits and PEP 691's literal ``+`` in ``?format=`` are
answered, and a busy port, a port it may not bind or an unreadable store is one line and the
exit code of its class."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from index_fixtures import cli, write_htpasswd
from index_wheels import variant_wheel

from factory.index.publish import publish
from factory.index.server import running_server
from factory.store import LocalStore

PASSWORD = "s3cret-Pa55"  # noqa: S105 (a test credential)


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    publish(LocalStore(root), [variant_wheel(tmp_path / "w", "fa-demo", "1.0", "2.14")])
    return root


def _status(data: bytes) -> int:
    return int(data[9:12]) if data.startswith(b"HTTP/1.") else 0


def _get(port: int, target: str, *headers: str, timeout: float = 30) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    request = f"GET {target} HTTP/1.1\r\nHost: x\r\n{head}Connection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


class Trickle:
    """Sockets that each send their start at once, then one byte of ``drip`` every
    ``every`` seconds (the rest of a head, or of a body), until the server drops them."""

    def __init__(self, port: int, every: float) -> None:
        self.port, self.every = port, every
        self.socks: list[tuple[socket.socket, bytes]] = []
        self.closed: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def open(self, start: bytes, drip: bytes, count: int) -> None:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(start)
            self.socks.append((s, drip))

    def _run(self) -> None:
        step = 0
        while not self._stop.wait(self.every):
            for i, (s, drip) in enumerate(self.socks):
                if i in self.closed:
                    continue
                try:
                    if drip:
                        s.sendall(drip[step % len(drip) : step % len(drip) + 1])
                    s.setblocking(False)
                    try:
                        if s.recv(65536) == b"":
                            self.closed.add(i)
                    except BlockingIOError:
                        pass
                    finally:
                        s.setblocking(True)
                except OSError:
                    self.closed.add(i)
            step += 1

    def __enter__(self) -> Trickle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s, _ in self.socks:
            s.close()

    def wait_all_dropped(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if len(self.closed) == len(self.socks):
                return True
            time.sleep(0.2)
        return False


SLOW_HEAD = (b"GET /simple/ HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")
# The three ways a head reaches the server: the read loop's (GET over HTTP/1.1) and the
# threaded handler's (HTTP/1.0, and an upload), each trickling one byte every few seconds.
SLOW_HEADS = (SLOW_HEAD, (b"GET /simple/ HTTP/1.0\r\n", b"X-Slow: 1\r\n"),
              (b"POST / HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n"))


def _keep_alive_get(port: int, target: str = "/simple/") -> tuple[socket.socket, int]:
    """A GET on a connection left open after its answer (so its slot stays taken)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), b"0"))
    while len(body) < length and (chunk := s.recv(65536)):
        body += chunk
    return s, _status(data)


def _cap_is(port: int, cap: int) -> None:
    """``cap`` keep-alive connections are answered and the next one is refused: no slot was
    lost or gained on the way (retried a few seconds while closed connections are noticed)."""
    deadline = time.monotonic() + 10
    while True:
        held = []
        try:
            statuses = []
            for _ in range(cap + 1):
                s, status = _keep_alive_get(port)
                held.append(s)
                statuses.append(status)
            if statuses == [200] * cap + [503] or time.monotonic() > deadline:
                assert statuses == [200] * cap + [503], statuses
                return
        finally:
            for s in held:
                s.close()
        time.sleep(0.5)


@pytest.mark.parametrize("workers", [1, 2])
def test_slow_heads_on_every_slot_do_not_lock_a_normal_client_out(
    populated: Path, workers: int
) -> None:
    """20 sockets trickling a head a byte every 3 s (GET over HTTP/1.1 and 1.0, an upload)
    hold all of `factory serve --max-connections 20`; each new client takes the slot of the
    head that has been arriving longest, whichever its kind, and gets its page within a
    second. With --workers 2 the slow heads are all in one process (the other was stopped)
    and the clients all reach the other one (the first is stopped then): the slot moves
    across. Before, the heads the
    threaded handler read (HTTP/1.0, uploads) could not be dropped, nor those of another
    worker: every client got 503 until the heads' 20 s limit ran out."""
    with _serve(populated, "--max-connections", "20", "--workers", str(workers)) as (proc, port):
        other = _worker(proc) if workers == 2 else None
        if other is not None:
            os.kill(other, signal.SIGSTOP)  # every slow head goes to the first process
        clients: list[socket.socket] = []
        try:
            with Trickle(port, every=3.0) as slow:
                for i in range(20):  # the oldest three: one of each kind
                    slow.open(*SLOW_HEADS[i % 3], count=1)
                    time.sleep(0.02)
                time.sleep(3.0)  # past a second (a real client's head), and offered to others
                if other is not None:
                    os.kill(proc.pid, signal.SIGSTOP)
                    os.kill(other, signal.SIGCONT)  # the clients all reach the other worker
                for _ in range(3):
                    started = time.monotonic()
                    sock, status = _keep_alive_get(port)  # kept open: each needs a slot
                    elapsed = time.monotonic() - started
                    clients.append(sock)
                    assert status == 200 and elapsed < 1.0, (status, elapsed)
                os.kill(proc.pid, signal.SIGCONT)  # drops the heads it owes the other worker
                deadline = time.monotonic() + 10
                while len(slow.closed) < 3 and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(0.5)
                assert slow.closed == {0, 1, 2}, "not the three oldest heads dropped"
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            for sock in clients:
                sock.close()
        _cap_is(port, 20)


def test_slow_heads_and_bodies_are_dropped_and_logged_once(
    populated: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Heads answered by the read loop and by the threaded handler (HTTP/1.0), a body below
    the minimum rate, a client that connects and sends nothing: each is dropped at its limit,
    however steadily the bytes trickle, with one log line for the peer."""
    caplog.set_level(logging.WARNING, logger="factory.index.server")
    htpasswd = write_htpasswd(tmp_path / "htpasswd", "uploader", PASSWORD)
    auth = base64.b64encode(f"uploader:{PASSWORD}".encode()).decode()
    upload = (
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b0undary\r\n"
        f"Authorization: Basic {auth}\r\nContent-Length: 100000\r\n\r\n--b0undary\r\n"
    ).encode()
    with running_server(populated, htpasswd=htpasswd, head_timeout=2.0, min_body_rate=1000.0,
                        body_grace=1.0) as server, Trickle(server.port, every=0.25) as slow:
        slow.open(*SLOW_HEAD, count=5)
        slow.open(b"GET /simple/ HTTP/1.0\r\n", b"X-Slow: 1\r\n", count=3)
        slow.open(upload, b"abcdef", count=3)
        slow.open(b"", b"", count=2)  # sends nothing at all
        assert slow.wait_all_dropped(30), f"{len(slow.closed)} of {len(slow.socks)} dropped"
        assert _status(_get(server.port, "/simple/")) == 200
        assert server.stats.slow >= len(slow.socks)
    lines = [r.getMessage() for r in caplog.records if "slow client" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("slow client 127.0.0.1: "), lines
    assert not list(populated.rglob(".tmp-*"))  # the dropped uploads left nothing


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


@contextlib.contextmanager
def _serve(store: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(cli("serve", "--store", str(store), "--port", str(port), *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("serving"), proc.stderr.read() if proc.stderr \
            else ""
        yield proc, port
    finally:
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
        proc.terminate()
        proc.communicate(timeout=30)


def _worker(proc: subprocess.Popen[str]) -> int:
    """The one worker process `factory serve --workers 2` forked."""
    deadline = time.monotonic() + 30
    while not (workers := _children(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 1, workers
    return workers[0]


def test_workers_keep_one_connection_cap_for_the_whole_server(populated: Path) -> None:
    """--workers 2 --max-connections 20 with one worker stopped: the other takes every
    connection, and holds all 20 (fixed shares of 10 each refused the 11th), then refuses
    the 21st."""
    with _serve(populated, "--workers", "2", "--max-connections", "20") as (proc, port):
        worker = _worker(proc)
        os.kill(worker, signal.SIGSTOP)
        held = []
        try:
            for _ in range(20):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(b"GET /simple/ HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: stays
                held.append(s)
                assert _status(s.recv(65536)) == 200, f"connection {len(held)} refused"
            assert _status(_get(port, "/simple/")) == 503
        finally:
            for s in held:
                s.close()
            os.kill(worker, signal.SIGCONT)


def test_a_range_of_thousands_of_digits_is_answered(
    populated: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="factory.index.server")
    wheel = next((populated / "files" / "fa-demo").glob("*.whl"))
    target = f"/files/fa-demo/{wheel.name.replace('+', '%2B')}"
    size = wheel.stat().st_size
    huge = "9" * 5000
    with running_server(populated) as server:
        assert _status(_get(server.port, target, f"Range: bytes={huge}-")) == 416
        for spec in (f"0-{huge}", f"-{huge}", f"{'0' * 5000}-"):
            response = _get(server.port, target, f"Range: bytes={spec}")
            assert _status(response) == 206, spec[:20]
            assert f"Content-Range: bytes 0-{size - 1}/{size}".encode() in response
        assert server.stats.server_errors == 0
    assert "Traceback" not in caplog.text


def test_format_with_pep_691s_literal_plus(populated: Path) -> None:
    with running_server(populated) as server:
        for query in ("application/vnd.pypi.simple.v1+json",
                      "application/vnd.pypi.simple.v1%2Bjson"):
            response = _get(server.port, f"/simple/fa-demo/?format={query}")
            assert _status(response) == 200, query
            assert b"Content-Type: application/vnd.pypi.simple.v1+json" in response
            assert json.loads(response.split(b"\r\n\r\n", 1)[1])["name"] == "fa-demo"


def _serve_fails(store: Path, *args: str, prefix: tuple[str, ...] = ()) -> tuple[int, str]:
    proc = subprocess.run([*prefix, *cli("serve", "--store", str(store), *args)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def test_serve_on_a_busy_port_is_one_line(populated: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = _serve_fails(populated, "--port", str(port))
    assert code == 2, err
    assert err.startswith(f"ERROR cannot listen on 127.0.0.1:{port}: the port is in use"), err
    assert "Traceback" not in err and "internal error" not in err and len(err.splitlines()) <= 2


def _without(*caps: str) -> tuple[str, ...]:
    """A command prefix that runs without these capabilities (root has them all)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    return (setpriv, "--bounding-set=" + ",".join(f"-{c}" for c in caps), "--inh-caps=-all")


def test_serve_without_permission_to_bind_is_one_line(populated: Path) -> None:
    code, err = _serve_fails(populated, "--port", "81", prefix=_without("net_bind_service"))
    assert code == 2, err
    assert err.startswith("ERROR cannot listen on 127.0.0.1:81: permission denied"), err
    assert "Traceback" not in err and "internal error" not in err


def test_serve_of_an_unreadable_store_is_one_line(populated: Path) -> None:
    populated.chmod(0)
    try:
        code, err = _serve_fails(populated, "--port", "0",
                                 prefix=_without("dac_override", "dac_read_search"))
    finally:
        populated.chmod(0o755)
    assert code == 11, err
    assert err.startswith(f"ERROR cannot read store {populated}: Permission denied"), err
    assert "Traceback" not in err and "internal error" not in err
