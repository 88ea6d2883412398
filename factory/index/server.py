"""The embedded index server: serves the generated tree of a local store.

Why not pypiserver: it renders its own PEP 503 pages from a directory scan and has no PEP 658
metadata, PEP 691 JSON, PEP 592 yanks or per-variant sub-indexes, so extending it would mean
replacing the part it is for. Resolving 12 variants of a 60 MB wheel, pip downloaded whole
wheels from it where this tree gives it 150-byte metadata files (docs/BENCHMARKS.md, "Index").
The pages here are files written at publish time; serving them is a file read.

No fallback: a name that is not in the store is a 404, never a redirect to a public index.
Uploads (twine's multipart POST to ``/`` or ``/legacy/``) need credentials from an htpasswd
file; reads are open unless ``read_auth``. Credentials never reach a log line.

The parts: ``server_loop.py`` (the one thread that accepts connections and answers plain
reads), ``server_handler.py`` (a thread per connection for everything else: uploads, auth,
ranges, malformed input), ``server_http.py`` (negotiation, validators, ranges, gzip, the page
cache), ``server_routes.py`` (what a request target names). This module holds them together:
the connection cap (shared by ``--workers`` processes, ``server_slots.py``), the 503s past it,
slow clients, and starting and stopping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import queue
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

from factory.errors import StoreError, UsageError
from factory.index.htpasswd import Credentials
from factory.index.server_handler import Handler
from factory.index.server_http import (
    PageCache,
    file_validators,
    head,
    log_access,
    negotiate,
    not_modified,
    page_answer,
    parse_range,
)
from factory.index.server_loop import (
    GRACE,
    HEAD_TIMEOUT,
    MIN_RATE,
    Answer,
    Headers,
    ReadLoop,
)
from factory.index.server_routes import route
from factory.index.server_slots import MADE_ROOM, ConnectionSlots, HandedHeads, SlowClients
from factory.store.local import LocalStore
from factory.wheels.checks import DEFAULT_LIMITS, WheelLimits

log = logging.getLogger("factory.index.server")

MAX_UPLOAD = 4 * 1024**3
MAX_CONNECTIONS = 512  # past this, a 503 (pip retries those)
_LINGER_SECONDS = 2.0  # after a refusal, read (and drop) what the client still sends, this long
_LINGER_BYTES = 64 * 1024 * 1024
# Requests with these go to the threaded handler: a body, ranges, an expectation.
_CACHED_FILES = (".whl.metadata",)  # served from memory by the read loop
_HANDLER_HEADERS = ("content-length", "transfer-encoding", "expect", "range", "if-range")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    store: Path  # a local store root
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port
    htpasswd: Path | None = None  # uploads are refused without one
    read_auth: bool = False  # reads need credentials too
    max_upload: int = MAX_UPLOAD  # bytes of one upload request
    max_connections: int = MAX_CONNECTIONS  # for the whole server, all workers together
    wheel_limits: WheelLimits = DEFAULT_LIMITS
    head_timeout: float = HEAD_TIMEOUT  # seconds for a whole request head
    min_body_rate: float = MIN_RATE  # bytes/s on average, bodies in and answers out ...
    body_grace: float = GRACE  # ... once this many seconds have passed


@dataclasses.dataclass
class ServerStats:
    not_found: int = 0
    auth_failures: int = 0
    uploads: int = 0
    server_errors: int = 0
    malformed: int = 0  # requests refused before a handler ran (bad request line, TLS, ...)
    busy: int = 0  # connections answered 503: the connection cap was reached
    handler_errors: int = 0  # exceptions that escaped a handler (logged as one line)
    slow: int = 0  # connections dropped for being slow (a head, a body, a reader)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


class IndexServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # resolvers arrive in bursts; the default backlog is 5

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store = LocalStore(config.store)
        self.credentials = Credentials(config.htpasswd) if config.htpasswd else None
        if config.read_auth and self.credentials is None:
            raise UsageError("read auth needs an htpasswd file (--htpasswd)")
        if config.max_connections < 1:
            raise UsageError("the connection cap must be at least 1")
        self.stats = ServerStats()
        self.slots = ConnectionSlots(config.max_connections)
        self._slow = SlowClients()
        # Connections past the cap get their 503 from one thread, never from the accept loop.
        self._turned_away: queue.Queue[socket.socket | None] = queue.Queue(maxsize=4096)
        self._busy_logged = 0.0
        self._threads_in: int | None = None  # the process whose turn-away thread runs
        self.pages = PageCache(self.store)
        self.small_files = PageCache(
            self.store, compress=False
        )  # PEP 658 metadata (immutable, small)
        # what the loop read before a hand-off, and when the head began
        self._handed: dict[socket.socket, tuple[bytes, float]] = {}
        self.heads = HandedHeads()  # the heads handler threads are reading
        self._loop: ReadLoop | None = None
        super().__init__((config.host, config.port), Handler)
        self._loop = self._new_loop(parent=None)
        self._made_in = os.getpid()

    def _new_loop(self, parent: int | None) -> ReadLoop:
        c = self.config
        return ReadLoop(self, self.socket, idle_timeout=Handler.timeout,
                        head_timeout=c.head_timeout, min_rate=c.min_body_rate,
                        grace=c.body_grace, parent=parent)

    # -- the read loop (server_loop.py) and the threads it hands connections to -------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        if os.getpid() != self._made_in:  # a worker forked by serve_workers: its own loop,
            self._loop = self._new_loop(parent=self._made_in)  # ends when the first one does
        if self._threads_in != os.getpid():  # threads do not survive a fork: start them here
            self._threads_in = os.getpid()
            threading.Thread(target=self._turn_away, name="factory-busy", daemon=True).start()
        assert self._loop is not None
        self._loop.run(poll_interval)

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.stop()

    def turn_away(self, sock: socket.socket) -> None:
        """A 503 for a connection past the cap, from the turn-away thread."""
        self.stats.add(busy=1)
        try:
            self._turned_away.put_nowait(sock)
        except queue.Full:  # a flood: no answer at all is all that is affordable
            self.close_request(sock)

    def release(self, sock: socket.socket, *, give: bool = True) -> None:
        self.close_request(sock)
        if give:  # else its slot went to the connection it made room for
            self.slots.give()

    def handed(self, sock: socket.socket) -> tuple[bytes, float]:
        return self._handed.pop(sock, (b"", time.monotonic()))

    def slow_handed(self, before: float) -> list[tuple[float, socket.socket]]:
        return self.heads.slow(before)

    def drop_handed(self, sock: socket.socket) -> bool:
        """A handler thread's slow head dropped to make room: its slot is the caller's."""
        try:
            peer = str(sock.getpeername()[0])
        except OSError:
            peer = "-"  # gone already
        if not self.heads.drop(sock):
            return False
        self.slow_client(peer, MADE_ROOM)
        return True

    def slow_client(self, address: str, what: str) -> None:
        """A connection dropped for being slow: counted, and one line per peer."""
        self.stats.add(slow=1)
        if self._slow.first(address):
            log.warning(
                "slow client %s: %s; dropped (its later slow connections are dropped without a "
                "line)", address, what,
            )

    def hand_off(self, sock: socket.socket, address: tuple[str, int], data: bytes,
                 since: float) -> None:
        """The connection to a thread of its own, from the bytes the loop already read."""
        self._handed[sock] = (data, since)
        try:
            super().process_request(sock, address)
        except BaseException:
            self._handed.pop(sock, None)
            self.release(sock)
            raise

    def _answered(
        self, client: str, method: str, target: str, response: bytes, body: bytes = b"",
        headers: Headers | None = None,
    ) -> Answer:
        status = int(response[9:12])
        log_access(client=client, method=method, target=target, version="HTTP/1.1",
                   status=status, size=len(body), headers=headers)
        return Answer(head=response, body=body)

    def answer(self, method: str, target: str, headers: Headers, client: str) -> Answer | None:
        """The whole response to a plain read of a page or file, or None: the handler's."""
        if self.config.read_auth or "?" in target or "#" in target:
            return None
        if any(name in headers for name in _HANDLER_HEADERS):
            return None
        where = route(target, headers.get("Accept"))
        if where.kind == "page":
            page = self.pages.get(where.key)
            if page is None:
                return None
            status, body, extra = page_answer(page, where.vary, headers)
            if status == HTTPStatus.NOT_MODIFIED:
                extra.pop("Content-Encoding", None)
                return self._answered(client, method, target, head(status, extra),
                                      headers=headers)
            response = head(
                status, {"Content-Type": where.ctype, "Content-Length": str(len(body)), **extra}
            )
            return self._answered(
                client, method, target, response, b"" if method == "HEAD" else body,
                headers=headers,
            )
        if where.kind != "file":
            return None
        if where.key.endswith(_CACHED_FILES):  # small and read per candidate: from memory
            cached = self.small_files.get(where.key)
            if cached is None:
                return None
            size, mtime_ns = len(cached.body), cached.mtime_ns
            return self._file_answer(client, method, target, headers, size, mtime_ns, cached.body)
        try:
            f = self.store.open_file(where.key)  # never through a symlink
        except (StoreError, OSError):
            return None
        st = os.fstat(f.fileno())
        return self._file_answer(client, method, target, headers, st.st_size, st.st_mtime_ns, f)

    def _file_answer(
        self,
        client: str,
        method: str,
        target: str,
        headers: Headers,
        size: int,
        mtime_ns: int,
        content: bytes | BinaryIO,
    ) -> Answer:
        """A published file from memory (bytes) or from disk (an open file, sent with
        sendfile), with the handler's validators; 304 when the client has it."""
        validators = file_validators(size, mtime_ns)
        if not_modified(headers, validators["ETag"], mtime_ns / 1e9):
            status, fields = HTTPStatus.NOT_MODIFIED, validators
        else:
            status = HTTPStatus.OK
            fields = {
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
                **validators,
            }
        sending = status == HTTPStatus.OK and method != "HEAD" and size > 0
        if not isinstance(content, bytes) and not sending:
            content.close()
        log_access(client=client, method=method, target=target, version="HTTP/1.1",
                   status=int(status), size=size if sending else 0, headers=headers)
        response = head(status, fields)
        if not sending:
            return Answer(head=response)
        if isinstance(content, bytes):
            return Answer(head=response, body=content)
        return Answer(head=response, file=content, count=size)

    def process_request_thread(  # type: ignore[override]
        self, request: socket.socket, client_address: object
    ) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            if not self.heads.forget(request):  # else its slot went to another connection
                self.slots.give()

    def _turn_away(self) -> None:
        """Answer 503 to connections past the cap, all from this one thread: send at once (a
        short answer fits an empty socket buffer), stop writing, and close each when its client
        has read it and closed, or after a second. Nothing here waits on one slow client."""
        body = b"busy: too many connections, retry shortly\n"
        response = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        waiting = selectors.DefaultSelector()
        deadlines: dict[socket.socket, float] = {}

        def close(sock: socket.socket) -> None:
            with contextlib.suppress(KeyError, ValueError):
                waiting.unregister(sock)
            deadlines.pop(sock, None)
            self.close_request(sock)

        while True:
            try:
                sock: socket.socket | None = self._turned_away.get(
                    timeout=0.05 if deadlines else None
                )
            except queue.Empty:
                sock = None  # nothing new; only the waiting ones to look after
            else:
                if sock is None:  # server_close
                    for open_sock in list(deadlines):
                        close(open_sock)
                    return
            if sock is not None:
                try:
                    sock.setblocking(False)
                    sock.send(response)
                    sock.shutdown(socket.SHUT_WR)
                    waiting.register(sock, selectors.EVENT_READ)
                    deadlines[sock] = time.monotonic() + 1.0
                except OSError:
                    close(sock)
                self._log_busy()
            for key, _ in waiting.select(timeout=0) if deadlines else ():
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    data = conn.recv(65536)  # their request, dropped; b'': they closed
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    close(conn)
            now = time.monotonic()
            for conn, deadline in list(deadlines.items()):
                if deadline < now:
                    close(conn)

    def _log_busy(self) -> None:
        now = time.monotonic()
        if now - self._busy_logged > 1.0:  # a flood is one line a second, not one each
            self._busy_logged = now
            log.warning(
                "busy: connection cap (%d) reached; %d connection(s) answered 503 so far",
                self.config.max_connections,
                self.stats.busy,
            )

    # -- closing without losing the answer ------------------------------------------------
    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        """Close after the answer is out: stop writing, then drop what the client still sends
        (briefly). Closing with unread bytes makes the kernel send a reset, and a client that
        gets a reset may never see the 401, 413 or 414 it was sent."""
        self._linger_and_close(request, _LINGER_SECONDS)

    def _linger_and_close(self, request: socket.socket, seconds: float) -> None:
        with contextlib.suppress(OSError):
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + seconds
            dropped = 0
            while dropped < _LINGER_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                request.settimeout(left)
                chunk = request.recv(65536)
                if not chunk:
                    break
                dropped += len(chunk)
        self.close_request(request)

    def server_close(self) -> None:
        # also called by the socketserver constructor when the bind fails, before the loop
        super().server_close()
        if self._loop is not None:
            self._loop.close()
        if self._threads_in == os.getpid():
            self._turned_away.put(None)  # blocks only until the turn-away thread takes one

    def handle_error(self, request: object, client_address: object) -> None:
        """One line, never a traceback: whatever escaped a handler (a reset, a timeout)."""
        exc = sys.exc_info()[1]
        self.stats.add(handler_errors=1)
        host = client_address[0] if isinstance(client_address, tuple) else client_address
        log.warning("%s: connection ended: %s: %s", host, type(exc).__name__, exc)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"


# Requests with these go to the threaded handler: a body, ranges, an expectation.


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunningServer:
    url: str  # 'http://127.0.0.1:PORT/'
    port: int
    server: IndexServer

    @property
    def stats(self) -> ServerStats:
        return self.server.stats


def make_server(config: ServerConfig) -> IndexServer:
    """The server, listening; a port or address it cannot listen on is one UsageError line."""
    try:
        return IndexServer(config)
    except OSError as exc:
        raise UsageError(_listen_problem(config, exc)) from None


def _listen_problem(config: ServerConfig, exc: OSError) -> str:
    where = f"cannot listen on {config.host}:{config.port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where}: the port is in use (another server?); pick another with --port"
    if exc.errno == errno.EACCES:
        return (f"{where}: permission denied (ports below 1024 need root or "
                "CAP_NET_BIND_SERVICE); pick a port from 1024 up with --port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {config.host} is not an address of this host (--host)"
    if isinstance(exc, socket.gaierror):
        return f"{where}: unknown host name {config.host!r} (--host)"
    return f"{where}: {exc.strerror or exc}"


def serve_workers(server: IndexServer, workers: int) -> None:
    """Serve from ``workers`` processes sharing the server's listening socket and its
    connection cap, until interrupted or terminated. One process answers reads from one
    thread (the GIL): on a machine with more than one core, more processes answer more at
    once, and each is a task of its own to the scheduler. A worker ends within a second of the
    first process; a worker that ends gives its connection slots back."""
    children: dict[int, int] = {}  # pid -> worker index
    if workers > 1:
        server.slots.share(workers)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the finally below runs

        def reaped(*_: object) -> None:
            with contextlib.suppress(ChildProcessError):
                while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                    if pid in children:
                        server.slots.forget(children.pop(pid))

        signal.signal(signal.SIGCHLD, reaped)
    try:
        for index in range(1, workers):
            pid = os.fork()
            if pid == 0:  # a worker: serve until the first process is gone
                code = 0
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    server.slots.become(index)
                    server.serve_forever()
                except KeyboardInterrupt:
                    pass
                except BaseException as exc:
                    log.error("worker %d ended: %s: %s", os.getpid(), type(exc).__name__, exc)
                    code = 1
                finally:
                    os._exit(code)
            children[pid] = index
        server.serve_forever()
    finally:
        if workers > 1:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


@contextlib.contextmanager
def running_server(store: Path, **options: object) -> Iterator[RunningServer]:
    """Start the server in a thread (port 0: a free one) and stop it on exit; for tests too."""
    config = ServerConfig(store=Path(store), **{"port": 0, **options})  # type: ignore[arg-type]
    server = make_server(config)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name="factory-index",
        daemon=True,
    )
    thread.start()
    try:
        yield RunningServer(url=server.url, port=int(server.server_address[1]), server=server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


__all__ = [
    "ConnectionSlots", "IndexServer", "RunningServer", "ServerConfig", "ServerStats",
    "make_server", "negotiate", "parse_range", "route", "running_server", "serve_workers",
]
