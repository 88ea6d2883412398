"""The index server's threaded handler: every request the read loop does not answer itself.

Uploads, malformed input (a bad request line, HTTP/2 or HTTP/0.9, a TLS handshake, an overlong
line), HTTP/1.0, ranges, redirects, 404s and ``--read-auth`` reads come here, each connection
to a thread of its own, with the bytes the loop had already read (``IndexServer.hand_off``).

A connection's reads here are paced (``_Paced``): a request head must arrive in full within
``head_timeout`` of its first byte, and a body at ``min_body_rate`` bytes a second on average
once its first ``body_grace`` seconds are over, however the bytes trickle in. Socket timeouts
alone restart with every byte, so a client sending one byte a minute held a thread and a
connection slot for ever. A slow client is dropped and logged once (``SlowClients``). While a
head is arriving it is in ``HandedHeads``, so that when every slot is taken the read loop can
drop it for a new connection as it drops its own slow heads (``server_slots.py``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from factory.errors import ConflictError, StoreError, WheelError
from factory.index.htpasswd import Credentials
from factory.index.pages import HTML_TYPE, JSON_TYPE
from factory.index.publish import publish
from factory.index.server_http import (
    SERVER_NAME,
    PageCache,
    basic_user,
    file_validators,
    log_access,
    not_modified,
    page_answer,
    parse_range,
)
from factory.index.server_loop import too_slow
from factory.index.server_routes import route
from factory.index.server_slots import MADE_ROOM, HandedHeads
from factory.index.upload import UploadError, receive
from factory.store.local import LocalStore

log = logging.getLogger("factory.index.server")

_TLS_HANDSHAKE = b"\x16"  # the first byte of a TLS record carrying a ClientHello


class SlowClient(TimeoutError):
    """A request head not complete in time, or a body below the minimum rate."""


class HandlerServer(Protocol):
    """What the handler needs from the server around it (server.IndexServer)."""

    config: Any  # server.ServerConfig
    stats: Any  # server.ServerStats
    store: LocalStore
    credentials: Credentials | None
    pages: PageCache
    heads: HandedHeads

    # what the read loop had read, and when the head began
    def handed(self, sock: socket.socket) -> tuple[bytes, float]: ...

    def slow_client(self, address: str, what: str) -> None: ...


class _Paced(io.RawIOBase):
    """A handed-over connection's reader: the bytes the loop read first, then the socket, with
    limits that do not move forward with every byte (see the module docstring). ``idle`` is
    the wait for the first byte of a request (keep-alive) and for any one read; ``since``,
    when the loop saw the head begin."""

    def __init__(self, prefix: bytes, sock: socket.socket, *, since: float, heads: HandedHeads,
                 idle: float, head_timeout: float, min_rate: float, grace: float,
                 on_slow: Any) -> None:
        self._prefix = memoryview(prefix)
        self._sock = sock
        self._heads = heads
        self._idle, self._head_timeout = idle, head_timeout
        self._min_rate, self._grace = min_rate, grace
        self._on_slow = on_slow
        self._head_deadline: float | None = None
        self._body_started: float | None = None
        self._body_bytes = 0
        if prefix:
            self._head_begins(since)

    def _head_begins(self, now: float) -> None:
        self._head_deadline = now + self._head_timeout
        self._heads.begin(self._sock, now)

    def readable(self) -> bool:
        return True

    def start_head(self) -> None:
        """A new request: the head's clock starts with its first byte."""
        self._body_started = None
        if not self._prefix:
            self._head_deadline = None

    def head_done(self) -> None:
        """The head is whole: no new connection may take its slot any more."""
        if not self._heads.end(self._sock):
            raise SlowClient(MADE_ROOM)  # dropped just before (and logged then)

    def start_body(self) -> None:
        self.head_done()
        self._head_deadline = None
        self._body_started, self._body_bytes = time.monotonic(), 0

    def _slow(self, what: str) -> SlowClient:
        self._on_slow(what)
        return SlowClient(what)

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        now = time.monotonic()
        timeout = self._idle
        if self._body_started is not None:
            elapsed = now - self._body_started
            if too_slow(elapsed, self._body_bytes, self._min_rate, self._grace):
                raise self._slow(f"body below {self._min_rate:.0f} bytes/s")
            # wait no longer than the moment the average would fall below the minimum
            timeout = min(timeout, max(self._grace, self._body_bytes / self._min_rate)
                          - elapsed + 0.01)
        elif self._head_deadline is not None:
            timeout = self._head_deadline - now
            if timeout <= 0:
                raise self._slow(f"request head not complete in {self._head_timeout:g} s")
        try:
            self._sock.settimeout(max(timeout, 0.001))
            n = self._sock.recv_into(buffer)
        except TimeoutError:
            if self._body_started is None and self._head_deadline is None:
                raise  # idle between requests: an ordinary keep-alive timeout
            return self.readinto(buffer)  # the limit decides, on the next round
        except OSError:
            if self._heads.dropped(self._sock):
                raise SlowClient(MADE_ROOM) from None
            raise
        finally:
            with contextlib.suppress(OSError):
                self._sock.settimeout(self._idle)  # writes keep the plain timeout
        if self._heads.dropped(self._sock):  # the loop shut it down to make room
            raise SlowClient(MADE_ROOM)
        if self._body_started is not None:
            self._body_bytes += n
        elif self._head_deadline is None and n:
            self._head_begins(time.monotonic())
        return n


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: pip and uv reuse connections
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the
    # client's delayed ACK of the first: 40 ms on every keep-alive request.
    disable_nagle_algorithm = True
    server_version = SERVER_NAME
    timeout = 60  # idle keep-alive connections give their thread back
    server: HandlerServer  # type: ignore[assignment]

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
        log_access(client=self.client_address[0], method=command,
                   target=getattr(self, "path", None) or "",
                   version=getattr(self, "request_version", "") or "HTTP/1.0",
                   status=int(code) if str(code).isdigit() else code, size=size,
                   headers=getattr(self, "headers", None), user=getattr(self, "_user", None))

    # -- the request line and the connection (malformed input gets a 4xx, never a traceback) --
    default_request_version = "HTTP/1.0"  # so that a refused HTTP/0.9 line gets a status line

    def setup(self) -> None:
        super().setup()
        # The read loop handed this connection over: read first what it already had.
        self._already, since = self.server.handed(self.connection)
        config = self.server.config
        peer = str(self.client_address[0])
        self._paced = _Paced(
            self._already, self.connection, since=since, heads=self.server.heads,
            idle=self.timeout, head_timeout=config.head_timeout,
            min_rate=config.min_body_rate, grace=config.body_grace,
            on_slow=lambda what: self.server.slow_client(peer, what),
        )
        self.rfile = io.BufferedReader(self._paced)

    def handle_one_request(self) -> None:
        self._paced.start_head()
        super().handle_one_request()

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
        if not super().parse_request():  # reads the headers (and answers Expect)
            return False
        self._paced.start_body()
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
        self._paced.head_done()  # the checks below may take a while (a hash)
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
            self.connection.sendfile(f, first, last - first + 1)

    # -- uploads --------------------------------------------------------------------------
    def do_POST(self) -> None:
        try:
            self._post()
        except SlowClient:
            self.close_connection = True  # said once, by the pacing
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
