"""The embedded index server: serves the generated tree of a local store.

Why not pypiserver: it renders its own PEP 503 pages from a directory scan and has no PEP 658
metadata, PEP 691 JSON, PEP 592 yanks or per-variant sub-indexes, so extending it would mean
replacing the part it is for. Resolving 12 variants of a 60 MB wheel, pip downloaded whole
wheels from it where this tree gives it 150-byte metadata files (docs/BENCHMARKS.md, "Index").
The pages here are files written at publish time; serving them is a file read.

No fallback: a name that is not in the store is a 404, never a redirect to a public index.
Uploads (twine's multipart POST to ``/`` or ``/legacy/``) need credentials from an htpasswd
file; reads are open unless ``read_auth``. Credentials never reach a log line.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import email.utils
import gzip
import hashlib
import io
import logging
import os
import queue
import re
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, quote, unquote, urlsplit

from packaging.utils import canonicalize_name

from factory.errors import (
    ConflictError,
    StoreError,
    UsageError,
    WheelError,
)
from factory.index.htpasswd import Credentials
from factory.index.pages import BROWSED_PAGES, HTML_TYPE, JSON_TYPE
from factory.index.publish import publish
from factory.index.server_loop import Answer, Headers, ReadLoop, header_lines
from factory.index.upload import UploadError, receive
from factory.logger import ACCESS
from factory.matrix.tags import VARIANT_RE
from factory.store.base import FILE_CACHE_CONTROL, PAGE_CACHE_CONTROL, WHEEL_VARIANTS
from factory.store.local import LocalStore
from factory.wheels.checks import DEFAULT_LIMITS, WheelLimits

log = logging.getLogger("factory.index.server")

_FILE_SUFFIXES = (".whl", ".whl.metadata", ".whl.provenance.json")
MAX_UPLOAD = 4 * 1024**3
MAX_CONNECTIONS = 512  # each one is a thread; past this, a 503 (pip retries those)
_TLS_HANDSHAKE = b"\x16"  # the first byte of a TLS record carrying a ClientHello
_LINGER_SECONDS = 2.0  # after a refusal, read (and drop) what the client still sends, this long
_LINGER_BYTES = 64 * 1024 * 1024
# What each Accept type gets: PEP 691 names, plus the plain ones browsers and pip send.
_NEGOTIABLE = {
    JSON_TYPE: "json",
    "application/vnd.pypi.simple.latest+json": "json",
    HTML_TYPE: "html",
    "application/vnd.pypi.simple.latest+html": "html",
    "text/html": "html",
    "*/*": "html",
    "text/*": "html",
    "application/*": "json",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    store: Path  # a local store root
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port
    htpasswd: Path | None = None  # uploads are refused without one
    read_auth: bool = False  # reads need credentials too
    max_upload: int = MAX_UPLOAD  # bytes of one upload request
    max_connections: int = MAX_CONNECTIONS
    wheel_limits: WheelLimits = DEFAULT_LIMITS


@dataclasses.dataclass
class ServerStats:
    requests: int = 0
    not_found: int = 0
    auth_failures: int = 0
    uploads: int = 0
    server_errors: int = 0
    bytes_sent: int = 0
    malformed: int = 0  # requests refused before a handler ran (bad request line, TLS, ...)
    busy: int = 0  # connections answered 503: the connection cap was reached
    handler_errors: int = 0  # exceptions that escaped a handler (logged as one line)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


def negotiate(accept: str | None, query_format: str | None = None) -> str | None:
    """'json', 'html', or None when nothing acceptable (PEP 691: default HTML)."""
    if query_format:
        return _NEGOTIABLE.get(query_format)
    if not accept:
        return "html"
    best: tuple[float, int, str] | None = None
    for position, item in enumerate(accept.split(",")):
        media, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        kind = _NEGOTIABLE.get(media.lower())
        if kind and q > 0 and (best is None or (q, -position) > (best[0], best[1])):
            best = (q, -position, kind)
    return best[2] if best else None


# -- HTTP caching: validators, conditional requests, ranges, compression -----------------------
_GZIP_MIN = 512  # smaller pages gain nothing from gzip
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


def http_date(timestamp: float) -> str:
    return email.utils.formatdate(timestamp, usegmt=True)


def _parse_http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed.timestamp() if parsed is not None else None


def not_modified(headers: Any, etag: str, mtime: float) -> bool:
    """RFC 9110 13.2.2: If-None-Match wins over If-Modified-Since when both are sent."""
    inm = headers.get("If-None-Match")
    if inm is not None:
        tags = {t.strip().removeprefix("W/") for t in inm.split(",")}
        return "*" in tags or etag in tags
    since = _parse_http_date(headers.get("If-Modified-Since"))
    return since is not None and int(mtime) <= since


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | bool:
    """One byte range as (first, last), None to send the whole body (no header, several
    ranges, or a form we ignore), False when unsatisfiable (416)."""
    if not header:
        return None
    m = _RANGE_RE.match(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return None  # several ranges or another unit: RFC 9110 allows the whole body
    if not m.group(1):  # the last N bytes
        n = int(m.group(2))
        if n == 0 or size == 0:
            return False
        return max(0, size - n), size - 1
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else size - 1
    if first >= size or last < first:
        return False
    return first, min(last, size - 1)


def accepts_gzip(header: str | None) -> bool:
    for item in (header or "").split(","):
        coding, *params = (p.strip() for p in item.split(";"))
        if coding.lower() in {"gzip", "x-gzip"}:
            for param in params:
                if param.startswith("q="):
                    try:
                        return float(param[2:]) > 0
                    except ValueError:
                        return False
            return True
    return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class CachedPage:
    body: bytes
    etag: str  # strong: a hash of the bytes
    mtime: float
    mtime_ns: int
    gzipped: bytes | None  # None: not worth it


Stamp = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class PageCache:
    """Index pages (and other small files) in memory, re-read when the file changes (its stat
    differs): each page is hashed and compressed once per version, not once per request.

    A hit costs one ``lstat``: a new version of a page is a new inode (written aside, then
    renamed over), so the same inode, size and mtime are the same bytes. Those bytes were read
    through the store's no-follow open, so a hit never serves a file reached through a link;
    a miss (a link planted in place of the page included) goes through that open again."""

    def __init__(self, store: LocalStore, limit: int = 4096, *, compress: bool = True) -> None:
        self.store = store
        self.limit = limit
        self.compress = compress
        self._pages: dict[str, tuple[Stamp, CachedPage]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> CachedPage | None:
        with self._lock:
            hit = self._pages.get(key)
        if hit is not None:
            try:
                if _stamp(os.lstat(self.store.path(key))) == hit[0]:
                    return hit[1]
            except (StoreError, OSError):
                pass
        try:
            # Never through a symlink, like the files: a link planted among the pages is a 404.
            with self.store.open_file(key) as f:
                st = os.fstat(f.fileno())
                stamp = _stamp(st)
                if hit is not None and hit[0] == stamp:
                    return hit[1]
                body = f.read()
        except (StoreError, OSError):
            return None
        page = CachedPage(
            body=body,
            etag='"' + hashlib.sha256(body).hexdigest()[:32] + '"',
            mtime=st.st_mtime,
            mtime_ns=st.st_mtime_ns,
            gzipped=(
                gzip.compress(body, 6, mtime=0)
                if self.compress and len(body) >= _GZIP_MIN
                else None
            ),
        )
        with self._lock:
            if len(self._pages) >= self.limit:
                self._pages.clear()
            self._pages[key] = (stamp, page)
        return page


def page_answer(
    page: CachedPage, vary: str, headers: Any
) -> tuple[HTTPStatus, bytes, dict[str, str]]:
    """Status, body and headers for a page: gzipped when the client asks and it is worth it,
    304 when the client's copy is current."""
    body, etag = page.body, page.etag
    extra = {"Vary": vary, "Cache-Control": PAGE_CACHE_CONTROL}
    if page.gzipped is not None and accepts_gzip(headers.get("Accept-Encoding")):
        body, etag = page.gzipped, etag[:-1] + '-gzip"'  # one strong tag per encoding
        extra["Content-Encoding"] = "gzip"
    extra["ETag"] = etag
    extra["Last-Modified"] = http_date(page.mtime)
    if not_modified(headers, etag, page.mtime):
        return HTTPStatus.NOT_MODIFIED, b"", extra
    return HTTPStatus.OK, body, extra


def file_validators(size: int, mtime_ns: int) -> dict[str, str]:
    """The caching headers of a published file: it never changes, so size and mtime identify
    the bytes, and clients and CDNs may keep it."""
    return {
        "Cache-Control": FILE_CACHE_CONTROL,
        "ETag": f'"{size:x}-{mtime_ns:x}"',
        "Last-Modified": http_date(mtime_ns / 1e9),
        "Accept-Ranges": "bytes",
    }


# -- routing: which page or file a request target names ---------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Route:
    kind: str  # 'page', 'file', 'redirect', 'not_found', 'not_acceptable'
    key: str = ""  # the store key (page, file) or the Location (redirect)
    ctype: str = ""  # pages: the Content-Type
    vary: str = ""  # pages: the Vary header


_NOT_FOUND = Route(kind="not_found")


def route(target: str, accept: str | None) -> Route:
    """Where a GET goes; the same for the threaded handler and the read loop."""
    split = urlsplit(target)
    raw_path = split.path
    parts = [unquote(p) for p in raw_path.split("/")[1:]]
    if raw_path == "/":
        return _page_route("index", {"format": ["text/html"]}, accept)
    if parts and parts[0] == "files":
        return _file_route(parts[1:], "files", _FILE_SUFFIXES)
    if parts[:2] == [WHEEL_VARIANTS, "files"]:
        return _file_route(parts[2:], f"{WHEEL_VARIANTS}/files", (".whl", "-variants.json"))
    query = parse_qs(split.query)
    if parts and parts[-1] in {"index.html", "index.json"}:
        return _page_file_route(parts)
    for browsed in BROWSED_PAGES:  # /finder/, /coverage/
        top = browsed.split("/")[0]
        if parts[:1] == [top]:
            if parts != [top, ""]:
                return Route(kind="redirect", key=f"/{top}/")
            return _page_route(browsed.removesuffix(".html"), {"format": ["text/html"]}, accept)
    if parts and (VARIANT_RE.match(parts[0]) or parts[0] == WHEEL_VARIANTS):
        prefix, parts = parts[0] + "/", parts[1:]
        if prefix == f"{WHEEL_VARIANTS}/":
            query = {"format": ["text/html"]}  # that tree has HTML pages only
    else:
        prefix = ""
    if not parts or parts[0] != "simple":
        return _NOT_FOUND
    rest = parts[1:]
    if not rest:  # '/simple' without the slash
        return Route(kind="redirect", key=f"/{prefix}simple/")
    if rest == [""]:
        return _page_route(f"{prefix}simple/index", query, accept)
    name = rest[0]
    normal = canonicalize_name(name)
    if len(rest) > 2 or (len(rest) == 2 and rest[1]):
        return _NOT_FOUND
    if name != normal or len(rest) == 1:
        if normal and re.fullmatch(r"[a-z0-9][a-z0-9-]*", normal):
            return Route(kind="redirect", key=f"/{prefix}simple/{quote(normal)}/")
        return _NOT_FOUND
    return _page_route(f"{prefix}simple/{normal}/index", query, accept)


def _page_route(base: str, query: dict[str, list[str]], accept: str | None) -> Route:
    formats = query.get("format") or []
    kind = negotiate(accept, formats[0] if formats else None)
    if kind is None:
        return Route(kind="not_acceptable")
    if kind == "json":
        ctype = JSON_TYPE
    else:
        ctype = HTML_TYPE if HTML_TYPE in (accept or "") else "text/html; charset=utf-8"
    return Route(kind="page", key=f"{base}.{kind}", ctype=ctype, vary="Accept, Accept-Encoding")


def _page_file_route(parts: list[str]) -> Route:
    """'/simple/index.html', '/<variant>/simple/<project>/index.json': the file itself, as a
    static host serves it (no negotiation)."""
    if any(not p for p in parts) or (len(parts) > 1 and parts[0] == "files"):
        return _NOT_FOUND
    ctype = "text/html; charset=utf-8" if parts[-1].endswith(".html") else JSON_TYPE
    return Route(kind="page", key="/".join(parts), ctype=ctype, vary="Accept-Encoding")


def _file_route(parts: list[str], prefix: str, suffixes: tuple[str, ...]) -> Route:
    if len(parts) != 2 or not parts[1].endswith(suffixes):
        return _NOT_FOUND
    return Route(kind="file", key=f"{prefix}/{parts[0]}/{parts[1]}")


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
        self._slots = threading.BoundedSemaphore(config.max_connections)
        # Connections past the cap get their 503 from one thread, never from the accept loop.
        self._turned_away: queue.Queue[socket.socket | None] = queue.Queue(maxsize=4096)
        self._busy_logged = 0.0
        self._threads_in: int | None = None  # the process whose turn-away thread runs
        self.pages = PageCache(self.store)
        self.small_files = PageCache(
            self.store, compress=False
        )  # PEP 658 metadata (immutable, small)
        self._handed: dict[socket.socket, bytes] = {}  # what the loop read before a hand-off
        super().__init__((config.host, config.port), _Handler)
        self._loop = ReadLoop(self, self.socket, idle_timeout=_Handler.timeout)
        self._made_in = os.getpid()

    # -- the read loop (server_loop.py) and the threads it hands connections to -------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        if os.getpid() != self._made_in:  # a worker forked by serve_workers: its own loop,
            self._loop = ReadLoop(  # which ends when the process that forked it is gone
                self, self.socket, idle_timeout=_Handler.timeout, parent=self._made_in
            )
        if self._threads_in != os.getpid():  # threads do not survive a fork: start them here
            self._threads_in = os.getpid()
            threading.Thread(target=self._turn_away, name="factory-busy", daemon=True).start()
        self._loop.run(poll_interval)

    def shutdown(self) -> None:
        self._loop.stop()

    def admit(self, sock: socket.socket) -> bool:
        """A slot for a new connection, or its 503 (the connection cap)."""
        if self._slots.acquire(blocking=False):
            return True
        self.stats.add(busy=1)
        try:
            self._turned_away.put_nowait(sock)
        except queue.Full:  # a flood: no answer at all is all that is affordable
            self.close_request(sock)
        return False

    def release(self, sock: socket.socket) -> None:
        self.close_request(sock)
        self._slots.release()

    def hand_off(self, sock: socket.socket, address: tuple[str, int], data: bytes) -> None:
        """The connection to a thread of its own, from the bytes the loop already read."""
        self._handed[sock] = data
        try:
            super().process_request(sock, address)
        except BaseException:
            self._handed.pop(sock, None)
            self.release(sock)
            raise

    def _answered(
        self, client: str, method: str, target: str, head: bytes, body: bytes = b"",
        headers: Headers | None = None,
    ) -> Answer:
        status = int(head[9:12])
        self.stats.add(requests=1, bytes_sent=len(body))
        _log_access(client=client, method=method, target=target, version="HTTP/1.1",
                    status=status, size=len(body), headers=headers)
        return Answer(head=head, body=body)

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
                return self._answered(client, method, target, _head(status, extra),
                                      headers=headers)
            head = _head(
                status, {"Content-Type": where.ctype, "Content-Length": str(len(body)), **extra}
            )
            return self._answered(client, method, target, head,
                                  b"" if method == "HEAD" else body, headers=headers)
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
        self.stats.add(requests=1, bytes_sent=size if sending else 0)
        _log_access(client=client, method=method, target=target, version="HTTP/1.1",
                    status=int(status), size=size if sending else 0, headers=headers)
        head = _head(status, fields)
        if not sending:
            return Answer(head=head)
        if isinstance(content, bytes):
            return Answer(head=head, body=content)
        return Answer(head=head, file=content, count=size)

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

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
        super().server_close()
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
_CACHED_FILES = (".whl.metadata",)  # served from memory by the read loop
_HANDLER_HEADERS = ("content-length", "transfer-encoding", "expect", "range", "if-range")
_SERVER_HEADER = ""  # 'Server: ...' as the handler sends it; set below the handler


def _head(status: HTTPStatus, headers: dict[str, str]) -> bytes:
    """A response head as the handler's send_response/send_header/end_headers write it."""
    return (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n{_SERVER_HEADER}"
        f"Date: {_date_now()}\r\n".encode("latin-1")
        + header_lines(headers)
        + b"\r\n"
    )


_date_cache: tuple[int, str] = (0, "")


def _date_now() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, http_date(now))
    return _date_cache[1]


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _quoted(value: str | None) -> str:
    """A quoted field of the access log: '-' when absent; quotes, backslashes and what is not
    printable escaped (as Apache does), so a client cannot forge a line."""
    if not value:
        return "-"
    out = []
    for ch in value[:400]:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable() and ord(ch) < 0x7F:
            out.append(ch)
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8", "replace")))
    return "".join(out)


def access_line(*, client: str, method: str, target: str, version: str, status: int | str,
                size: int | str, headers: Any, user: str | None = None,
                now: float | None = None) -> str:
    """One request in Combined Log Format (what log analysers and fail2ban read):
    ``host - user [day/Mon/year:H:M:S +0000] "METHOD /path VERSION" status bytes "referer"
    "user-agent"``. The path only: a query may hold a token."""
    t = time.gmtime(time.time() if now is None else now)
    when = (f"{t.tm_mday:02d}/{_MONTHS[t.tm_mon - 1]}/{t.tm_year}:{t.tm_hour:02d}:"
            f"{t.tm_min:02d}:{t.tm_sec:02d} +0000")
    try:
        path = urlsplit(target).path[:200] if target else "-"
    except ValueError:
        path = "-"
    request = f"{method[:20] or '-'} {_quoted(path)} {version or 'HTTP/1.0'}"
    return (f"{client} - {_quoted(user) if user else '-'} [{when}] \"{request}\" {status} "
            f"{size if size not in ('', None) else '-'} "
            f"\"{_quoted(headers.get('Referer') if headers else None)}\" "
            f"\"{_quoted(headers.get('User-Agent') if headers else None)}\"")


def basic_user(header: str | None) -> str | None:
    """The user name of a Basic Authorization header (already checked), for the access log."""
    try:
        decoded = base64.b64decode((header or "")[6:], validate=True)
        return decoded.partition(b":")[0].decode() or None
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


def _log_access(**fields: Any) -> None:
    log.info(access_line(**fields), extra=ACCESS)


class _Prefixed(io.RawIOBase):
    """A socket's reader that returns ``prefix`` first (what the read loop had read)."""

    def __init__(self, prefix: bytes, raw: Any) -> None:
        self._prefix = memoryview(prefix)
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        got: int | None = self._raw.readinto(buffer)  # None: never (a blocking socket)
        return got

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: pip and uv reuse connections
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the
    # client's delayed ACK of the first: 40 ms on every keep-alive request.
    disable_nagle_algorithm = True
    server_version = "factory-index"
    timeout = 60  # idle keep-alive connections give their thread back
    server: IndexServer

    # -- plumbing -------------------------------------------------------------------------
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        pass  # the stdlib line would include the raw request line; see log_request

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() == "content-length":
            self._content_length: str | None = value  # the access log's bytes
        super().send_header(keyword, value)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Also called for requests that never got a path (a malformed line): one line each.
        command = getattr(self, "command", None) or "-"
        if size == "-":
            size = "0" if command == "HEAD" else getattr(self, "_content_length", None) or "-"
        _log_access(client=self.client_address[0], method=command,
                    target=getattr(self, "path", None) or "",
                    version=getattr(self, "request_version", "") or "HTTP/1.0",
                    status=int(code) if str(code).isdigit() else code, size=size,
                    headers=getattr(self, "headers", None), user=getattr(self, "_user", None))

    # -- the request line and the connection (malformed input gets a 4xx, never a traceback) --
    default_request_version = "HTTP/1.0"  # so that a refused HTTP/0.9 line gets a status line

    def setup(self) -> None:
        super().setup()
        # The read loop handed this connection over: read first what it already had.
        self._already = self.server._handed.pop(self.connection, b"")
        if self._already:
            raw = _Prefixed(self._already, self.connection.makefile("rb", buffering=0))
            self.rfile = io.BufferedReader(raw)

    def handle(self) -> None:
        try:
            first = self._already[:1] or self.connection.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            return
        if first == _TLS_HANDSHAKE:
            self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""
            self.close_connection = True
            self.send_error(HTTPStatus.BAD_REQUEST, "this server speaks plain HTTP, not TLS")
            return
        super().handle()

    def parse_request(self) -> bool:
        self._upload_checked = False
        raw: bytes = self.raw_requestline  # type: ignore[attr-defined]  # set by the stdlib
        words = str(raw, "iso-8859-1").split()
        if not words:
            self.command, self.request_version = "", "HTTP/1.0"
            return self._malformed("empty request line")
        if len(words) == 2:  # before the stdlib waits for headers an HTTP/0.9 line never has
            self.command, self.request_version = "", "HTTP/1.0"
            return self._malformed("HTTP/0.9 requests are not supported")
        if not super().parse_request():
            return False
        if self.request_version.startswith("HTTP/0."):  # 'GET / HTTP/0.9': answered without
            self.request_version = "HTTP/1.0"  # a status line by the stdlib; refuse it with one
            return self._malformed("HTTP/0.x requests are not supported")
        try:
            urlsplit(self.path)
        except ValueError:
            return self._malformed("unparseable request target")
        if not self.path.startswith("/") or any(ord(c) < 0x21 or ord(c) == 0x7F for c in self.path):
            return self._malformed("the request target must be an absolute path")
        return True

    def _malformed(self, reason: str) -> bool:
        self.close_connection = True
        self.send_error(HTTPStatus.BAD_REQUEST, reason)
        return False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Only the request-line and header parsing get here (handlers answer with _text).
        self.server.stats.add(malformed=1)
        if str(getattr(self, "request_version", "")).startswith("HTTP/0."):
            # the stdlib set it before refusing the line ('\x00 \x00 \x00 HTTP/0.9', four
            # words): an HTTP/0.x answer has no status line, so answer as 1.0
            self.request_version = "HTTP/1.0"
        if code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:  # 'GET / HTTP/2.0': a malformed line
            code, message = (
                HTTPStatus.BAD_REQUEST,
                "HTTP/2 needs a connection preface; use HTTP/1.1",
            )
        super().send_error(code, message, explain)

    def handle_expect_100(self) -> bool:
        """curl (and others) wait for this before sending a body: refuse before it comes."""
        if self.command == "POST":
            if not self._upload_allowed():
                return False
            self._upload_checked = True
        return super().handle_expect_100()

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        # Count before answering: a client that has its answer must find it counted.
        if status == 404:
            self.server.stats.add(not_found=1)
        elif status >= 500:
            self.server.stats.add(server_errors=1)
        if self.command != "HEAD":
            self.server.stats.add(bytes_sent=len(body))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _text(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, (message + "\n").encode(), headers=headers)

    def _redirect(self, location: str) -> None:
        self._send(HTTPStatus.MOVED_PERMANENTLY, b"", headers={"Location": location})

    def _authorized(self) -> bool:
        creds = self.server.credentials
        if creds is not None and creds.check(self.headers.get("Authorization")):
            self._user = basic_user(self.headers.get("Authorization"))
            return True
        self.server.stats.add(auth_failures=1)
        if self.headers.get("Authorization"):
            self._text(HTTPStatus.FORBIDDEN, "wrong credentials")
        else:
            self._text(
                HTTPStatus.UNAUTHORIZED,
                "credentials required",
                {"WWW-Authenticate": 'Basic realm="factory index"'},
            )
        return False

    # -- reads ----------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self.server.stats.add(requests=1)
        try:
            if self.server.config.read_auth and not self._authorized():
                return
            self._get()
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:
            log.exception("error serving %s", urlsplit(self.path).path)
            with contextlib.suppress(Exception):
                self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")

    def _get(self) -> None:
        where = route(self.path, self.headers.get("Accept"))
        if where.kind == "page":
            return self._cached_page(where.key, where.ctype, vary=where.vary)
        if where.kind == "file":
            return self._file(where.key)
        if where.kind == "redirect":
            return self._redirect(where.key)
        if where.kind == "not_acceptable":
            return self._text(
                HTTPStatus.NOT_ACCEPTABLE, f"acceptable: {JSON_TYPE}, {HTML_TYPE}, text/html"
            )
        return self._text(HTTPStatus.NOT_FOUND, "not found")  # and no fallback

    def _cached_page(self, key: str, ctype: str, *, vary: str) -> None:
        """A page with a strong ETag and Last-Modified (304 when the client has it), gzipped
        when the client asks and it is worth it."""
        page = self.server.pages.get(key)
        if page is None:
            return self._text(HTTPStatus.NOT_FOUND, "not found")  # and no fallback
        status, body, extra = page_answer(page, vary, self.headers)
        if status == HTTPStatus.NOT_MODIFIED:
            return self._not_modified(extra)
        self._send(status, body, ctype, extra)

    def _not_modified(self, headers: dict[str, str]) -> None:
        self.send_response(HTTPStatus.NOT_MODIFIED)
        for name, value in headers.items():
            if name != "Content-Encoding":
                self.send_header(name, value)
        self.end_headers()

    def _file(self, key: str) -> None:
        try:
            # Never through a symlink: a link planted in the store is a 404, not /etc/passwd.
            f = self.server.store.open_file(key)
        except (StoreError, OSError):
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        with f:
            self._send_file(f)

    def _send_file(self, f: Any) -> None:
        """A published file: validators, 304, one byte range (206), sendfile for the body."""
        st = os.fstat(f.fileno())
        size = st.st_size
        headers = file_validators(size, st.st_mtime_ns)
        etag = headers["ETag"]
        if not_modified(self.headers, etag, st.st_mtime):
            return self._not_modified(headers)
        wanted = parse_range(self.headers.get("Range"), size)
        if_range = self.headers.get("If-Range")
        if (
            wanted is not None
            and if_range is not None
            and if_range.strip()
            not in {
                etag,
                headers["Last-Modified"],
            }
        ):
            wanted = None  # the client's copy is another version: send the whole file
        if wanted is False:
            headers["Content-Range"] = f"bytes */{size}"
            return self._send(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, b"", headers=headers)
        first, last = wanted if isinstance(wanted, tuple) else (0, size - 1)
        status = HTTPStatus.PARTIAL_CONTENT if isinstance(wanted, tuple) else HTTPStatus.OK
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(last - first + 1))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD" and last >= first:
            self.wfile.flush()
            sent = self.connection.sendfile(f, first, last - first + 1)
            self.server.stats.add(bytes_sent=sent)

    # -- uploads --------------------------------------------------------------------------
    def do_POST(self) -> None:
        self.server.stats.add(requests=1)
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
            log.warning("upload from %s ended: %s", self.client_address[0], type(exc).__name__)
            self.close_connection = True
        except Exception as exc:
            log.error("error handling an upload: %s: %s", type(exc).__name__, exc)
            self.close_connection = True
            with contextlib.suppress(Exception):
                self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")

    def _upload_allowed(self) -> bool:
        """Path, credentials and length, before one byte of the body is read. Sends the
        refusal (and closes the connection) when not allowed."""
        if urlsplit(self.path).path not in {"/", "/legacy/", "/legacy"}:
            self.close_connection = True
            self._text(HTTPStatus.NOT_FOUND, "not found")
            return False
        if self.server.credentials is None:
            self.close_connection = True  # the body is left unread
            self._text(HTTPStatus.FORBIDDEN, "uploads are disabled on this server")
            return False
        if not self._authorized():
            self.close_connection = True
            return False
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._text(HTTPStatus.LENGTH_REQUIRED, "Content-Length required (no chunked uploads)")
            return False
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._text(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
            return False
        if not 0 < length <= self.server.config.max_upload:
            self.close_connection = True
            self._text(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"upload too large (the limit is {self.server.config.max_upload} bytes)",
            )
            return False
        return True

    def _post(self) -> None:
        if not self._upload_checked and not self._upload_allowed():
            return
        length = int(self.headers["Content-Length"])
        try:
            upload = receive(
                self.rfile,  # type: ignore[arg-type]
                length,
                self.headers.get("Content-Type", ""),
                self.server.store.root,
                self.server.config.max_upload,
            )
        except (UploadError, WheelError) as exc:
            self.close_connection = True  # the rest of the body is not read
            message = exc.message if isinstance(exc, WheelError) else str(exc)
            return self._text(HTTPStatus.BAD_REQUEST, message)
        try:
            status, message = self._publish_upload(upload.fields, upload.sha256, upload.path)
        finally:
            upload.discard()  # before the answer: a client that has it finds no temp file left
        self._text(status, message)

    def _publish_upload(self, fields: dict[str, str], sha256: str, path: Path) -> tuple[int, str]:
        if fields.get(":action", "file_upload") != "file_upload":
            return HTTPStatus.BAD_REQUEST, "expected :action=file_upload"
        digest = fields.get("sha256_digest")
        if digest and digest.strip().lower() != sha256:
            return HTTPStatus.BAD_REQUEST, "sha256_digest does not match the upload"
        filename = path.name
        try:
            report = publish(self.server.store, [path], limits=self.server.config.wheel_limits)
        except ConflictError as exc:
            return HTTPStatus.CONFLICT, f"File already exists: {exc.message}"
        except (WheelError, StoreError) as exc:
            log.info("upload %s refused: %s", filename[:200], exc.message)
            return HTTPStatus.BAD_REQUEST, exc.message
        self.server.stats.add(uploads=1)
        state = "published" if report.published else "unchanged"
        log.info("upload %s: %s", filename, state)
        return HTTPStatus.OK, f"{state} {filename}"


_SERVER_HEADER = f"Server: {_Handler.server_version} {_Handler.sys_version}\r\n"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunningServer:
    url: str  # 'http://127.0.0.1:PORT/'
    port: int
    server: IndexServer

    @property
    def stats(self) -> ServerStats:
        return self.server.stats


def make_server(config: ServerConfig) -> IndexServer:
    try:
        return IndexServer(config)
    except OSError as exc:
        raise UsageError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from None


def serve_workers(server: IndexServer, workers: int) -> None:
    """Serve from ``workers`` processes sharing the server's listening socket, until
    interrupted or terminated. One process answers reads from one thread (the GIL): on a
    machine with more than one core, more processes answer more at once, and each is a task
    of its own to the scheduler. A worker ends within a second of the first process."""
    children: list[int] = []
    if workers > 1:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the finally below runs
    try:
        for _ in range(workers - 1):
            pid = os.fork()
            if pid == 0:  # a worker: serve until the first process is gone
                code = 0
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    server.serve_forever()
                except KeyboardInterrupt:
                    pass
                except BaseException as exc:
                    log.error("worker %d ended: %s: %s", os.getpid(), type(exc).__name__, exc)
                    code = 1
                finally:
                    os._exit(code)
            children.append(pid)
        server.serve_forever()
    finally:
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
