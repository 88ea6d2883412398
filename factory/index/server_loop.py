"""The index server's read loop: one thread accepts every connection and answers the reads.

Why one thread: with a thread per connection, 200 keep-alive resolvers on 2 cores were 200
threads taking turns at the GIL in no particular order, and the accept loop waited for each new
thread to start; the tail was each connection's first request (p99 0.5 s with nothing else on
the machine, 1.1-1.3 s while 8 publishers wrote: docs/BENCHMARKS.md, issue 17). Here sockets
are non-blocking, requests are answered in the order they arrive, a page is bytes from memory
and a file goes out with ``sendfile``.

Only what the loop fully understands is answered here: ``GET``/``HEAD`` over HTTP/1.1, a
complete head in CRLF lines, no body, a page or a file that exists (``answer`` decides). All
else (uploads, malformed or TLS input, HTTP/1.0, ranges, redirects, 404s, read auth) is handed,
with the bytes already read, to the server's threaded handler, which answers it as it always
has and keeps that connection to its end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import selectors
import socket
import threading
import time
from collections.abc import Mapping
from typing import BinaryIO, Protocol

log = logging.getLogger("factory.index.server")

MAX_HEAD = 64 * 1024  # a longer head is the threaded handler's (414, 431)
_TARGET = re.compile(rb"/[\x21-\x7e]*")  # an absolute path, printable ASCII only
_MAX_HEADERS = 100  # as the stdlib's http.client
_ACCEPT_BATCH = 64  # connections accepted per wake-up before serving the others
_LINGER_SECONDS = 2.0  # after 'Connection: close': drop what the client still sends, this long


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answer:
    """A whole response: the head, then ``body`` or ``count`` bytes of ``file`` from 0."""

    head: bytes
    body: bytes = b""
    file: BinaryIO | None = None  # the loop closes it
    count: int = 0


class Headers(dict[str, str]):
    """Request headers, names lower-cased; ``get`` ignores case like ``email.message``."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)


class Server(Protocol):
    """What the loop needs from the server around it."""

    def admit(self, sock: socket.socket) -> bool: ...  # False: turned away (the cap)

    def answer(self, method: str, target: str, headers: Headers, client: str) -> Answer | None: ...

    def hand_off(self, sock: socket.socket, address: tuple[str, int], data: bytes) -> None: ...

    def release(self, sock: socket.socket) -> None: ...  # close and give the slot back


class _Conn:
    __slots__ = ("sock", "address", "inbuf", "out", "file", "offset", "left", "deadline", "state")

    def __init__(self, sock: socket.socket, address: tuple[str, int], deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.inbuf = bytearray()
        self.out = memoryview(b"")
        self.file: BinaryIO | None = None
        self.offset = 0
        self.left = 0
        self.deadline = deadline
        self.state = "open"  # 'open', 'close after' (the answer), 'closing' (lingering)


class ReadLoop:
    def __init__(
        self,
        server: Server,
        listener: socket.socket,
        *,
        idle_timeout: float,
        parent: int | None = None,  # a worker process: the pid it stops without
    ) -> None:
        self.server = server
        self.listener = listener
        self.idle_timeout = idle_timeout
        self.parent = parent
        self._stop = False
        self._done = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._conns: dict[socket.socket, _Conn] = {}

    # -- running and stopping ---------------------------------------------------------------
    def run(self, poll_interval: float = 0.5) -> None:
        self._done.clear()
        sel = selectors.DefaultSelector()
        try:
            self.listener.setblocking(False)
            sel.register(self.listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            next_sweep = time.monotonic() + 1.0
            while not self._stop:
                for key, mask in sel.select(timeout=min(poll_interval, 1.0)):
                    if key.fileobj is self.listener:
                        self._accept(sel)
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._ready(sel, key.data, mask)
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + 1.0
                    if self.parent is not None and os.getppid() != self.parent:
                        break  # a worker whose first process is gone
                    for conn in [c for c in self._conns.values() if c.deadline < now]:
                        self._close(sel, conn)  # idle keep-alive, a stalled head or reader
        finally:
            for conn in list(self._conns.values()):
                self._close(sel, conn)
            sel.close()
            self._stop = False
            self._done.set()

    def _ready(self, sel: selectors.BaseSelector, conn: _Conn, mask: int) -> None:
        if conn.sock not in self._conns:
            return  # closed or handed off earlier in this round
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(sel, conn)
                self._serve(sel, conn)  # requests that came while the answer went out
            elif mask & selectors.EVENT_READ:
                self._read(sel, conn)
        except Exception as exc:  # one connection's trouble never stops the loop
            log.warning("%s: connection ended: %s: %s", conn.address[0], type(exc).__name__, exc)
            self._close(sel, conn)

    def stop(self) -> None:
        """Ask ``run`` to return and wait until it has (as ``BaseServer.shutdown``)."""
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._done.wait()

    def close(self) -> None:
        self._wake_r.close()
        self._wake_w.close()

    # -- connections ------------------------------------------------------------------------
    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: the listener stays, try again next round
                return
            if not self.server.admit(sock):
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, address, time.monotonic() + self.idle_timeout)
            self._conns[sock] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        if conn.file is not None:
            conn.file.close()
            conn.file = None
        self.server.release(conn.sock)

    def _hand_off(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        del self._conns[conn.sock]
        sel.unregister(conn.sock)
        conn.sock.setblocking(True)
        self.server.hand_off(conn.sock, conn.address, bytes(conn.inbuf))

    def _read(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._close(sel, conn)
        if conn.state == "closing":  # lingering: drop it; b'' is the client's close
            if not data:
                self._close(sel, conn)
            return
        if not data:
            if conn.inbuf:  # half a request, then EOF: the handler answers what it can
                return self._hand_off(sel, conn)
            return self._close(sel, conn)
        conn.deadline = time.monotonic() + self.idle_timeout
        conn.inbuf += data
        self._serve(sel, conn)

    def _serve(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        """Answer the complete requests in the buffer, in order, while the answers go out."""
        while (
            conn.sock in self._conns
            and conn.inbuf
            and conn.state == "open"
            and not conn.out
            and conn.file is None
        ):
            buf = conn.inbuf
            end = buf.find(b"\r\n\r\n")
            if end < 0 or end >= MAX_HEAD:
                line_end = buf.find(b"\n")
                if (
                    len(buf) >= MAX_HEAD
                    or buf[0] == 0x16
                    or b"\n\n" in buf
                    or (line_end >= 0 and _request_line(bytes(buf[:line_end])) is None)
                ):
                    # too long, TLS, bare-LF lines, or a request line not for the loop (the
                    # handler answers that one at once, without waiting for headers)
                    return self._hand_off(sel, conn)
                return  # the rest of the head is on its way
            parsed = _parse_head(bytes(buf[:end]))
            answer = None
            if parsed is not None:
                method, target, headers = parsed
                answer = self.server.answer(method, target, headers, conn.address[0])
            if answer is None:
                return self._hand_off(sel, conn)
            del buf[: end + 4]
            conn.out = memoryview(answer.head + answer.body)
            conn.file, conn.offset, conn.left = answer.file, 0, answer.count
            if (headers.get("connection") or "").lower() == "close":
                conn.state = "close after"
            self._flush(sel, conn)

    def _flush(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        sock = conn.sock
        try:
            while conn.out:
                sent = sock.send(conn.out)
                conn.out = conn.out[sent:]
            while conn.file is not None and conn.left > 0:
                sent = os.sendfile(sock.fileno(), conn.file.fileno(), conn.offset, conn.left)
                if sent == 0:  # the file is shorter than it was: end the connection
                    return self._close(sel, conn)
                conn.offset += sent
                conn.left -= sent
        except (BlockingIOError, InterruptedError):
            conn.deadline = time.monotonic() + self.idle_timeout
            sel.modify(sock, selectors.EVENT_WRITE, conn)  # the rest when the client reads
            return
        except OSError:
            return self._close(sel, conn)
        if conn.file is not None:
            conn.file.close()
            conn.file = None
        if conn.state == "close after":
            # As the threaded handler: stop writing, drop what the client still sends, close
            # on its close (or after a while), so the answer is never lost to a reset.
            conn.state = "closing"
            conn.deadline = time.monotonic() + _LINGER_SECONDS
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            sel.modify(sock, selectors.EVENT_READ, conn)
            return
        sel.modify(sock, selectors.EVENT_READ, conn)


def _parse_head(head: bytes) -> tuple[str, str, Headers] | None:
    """Method, target and headers of a plain GET/HEAD; None for anything else."""
    lines = head.split(b"\r\n")
    request = _request_line(lines[0] + b"\r")
    if request is None or len(lines) > _MAX_HEADERS + 1:
        return None
    headers = Headers()
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b"\n" in line or b"\r" in line:
            return None  # folded, bare CR/LF, no name: the stdlib's parser decides
        key = name.decode("latin-1").lower()
        if key in headers:
            return None  # repeated: the handler keeps its own rule for which one counts
        headers[key] = value.strip(b" \t").decode("latin-1")
    return request[0], request[1], headers


def _request_line(line: bytes) -> tuple[str, str] | None:
    """Method and target of 'GET|HEAD /target HTTP/1.1\\r' (the line up to its LF)."""
    words = line.split(b" ")
    if len(words) != 3 or words[2] != b"HTTP/1.1\r" or words[0] not in (b"GET", b"HEAD"):
        return None
    target = words[1]
    if not _TARGET.fullmatch(target):
        return None
    return words[0].decode(), target.decode("ascii")


def header_lines(items: Mapping[str, str]) -> bytes:
    return "".join(f"{name}: {value}\r\n" for name, value in items.items()).encode("latin-1")
