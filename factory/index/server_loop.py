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

Time limits that bytes cannot push out: a request head must be complete within
``head_timeout`` of its first byte (however slowly the rest trickles in), an answer must go out
at ``min_rate`` bytes a second on average once ``grace`` seconds have passed, and a keep-alive
connection may wait ``idle_timeout`` for its next request. When every connection slot is taken,
a new connection takes the slot of the connection whose head has been arriving longest, if
that has been over ``SLOW_HEAD`` seconds (a real client sends its head in one packet), be it
read here, by a handler thread or by another worker (``server_slots.py``): slow clients cannot
hold the slots against the others. Each slow client is reported to the server
(``slow_client``), which logs a peer once.
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

from factory.index.server_slots import MADE_ROOM, SLOW_HEAD, ConnectionSlots

log = logging.getLogger("factory.index.server")

MAX_HEAD = 64 * 1024  # a longer head is the threaded handler's (414, 431)
_TARGET = re.compile(rb"/[\x21-\x7e]*")  # an absolute path, printable ASCII only
_MAX_HEADERS = 100  # as the stdlib's http.client
_ACCEPT_BATCH = 64  # connections accepted per wake-up before serving the others
_LINGER_SECONDS = 2.0  # after 'Connection: close': drop what the client still sends, this long
HEAD_TIMEOUT = 20.0  # seconds for a whole request head, from its first byte
MIN_RATE = 1024.0  # bytes a second, on average: bodies read and answers sent, after the grace
GRACE = 10.0


def too_slow(elapsed: float, count: int, min_rate: float, grace: float) -> bool:
    """Below ``min_rate`` bytes a second on average, once ``grace`` seconds are over."""
    return elapsed > grace and count < min_rate * elapsed


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

    slots: ConnectionSlots  # the cap, and slow heads claimed across workers

    def turn_away(self, sock: socket.socket) -> None: ...  # a 503, and closed

    def slow_client(self, address: str, what: str) -> None: ...  # dropped for being slow

    def answer(self, method: str, target: str, headers: Headers, client: str) -> Answer | None: ...

    def hand_off(self, sock: socket.socket, address: tuple[str, int], data: bytes,
                 since: float) -> None: ...  # ``since``: when its head began

    # the heads handler threads are reading that began before ``before``, and when
    def slow_handed(self, before: float) -> list[tuple[float, socket.socket]]: ...

    def drop_handed(self, sock: socket.socket) -> bool: ...  # its slot is the caller's now

    def release(self, sock: socket.socket, *, give: bool = True) -> None: ...  # close; the slot


class _Conn:
    __slots__ = ("sock", "address", "inbuf", "out", "file", "offset", "left", "deadline", "state",
                 "head_started", "send_started", "sent")

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
        self.head_started: float | None = None  # the first byte of a head not complete yet
        self.send_started = 0.0  # when the answer now going out started
        self.sent = 0  # bytes of it sent so far

    def why_late(self) -> str | None:
        """What a connection past its deadline was doing, when that was being slow."""
        if self.state == "closing":
            return None  # lingering after its answer: the client has it
        if self.out or self.file is not None:
            return "reading its answer too slowly"
        if self.head_started is not None:
            return "request head not complete in time" if self.inbuf else "sent no request"
        return None  # idle keep-alive


class ReadLoop:
    def __init__(
        self,
        server: Server,
        listener: socket.socket,
        *,
        idle_timeout: float,
        head_timeout: float = HEAD_TIMEOUT,
        min_rate: float = MIN_RATE,
        grace: float = GRACE,
        parent: int | None = None,  # a worker process: the pid it stops without
    ) -> None:
        self.server = server
        self.listener = listener
        self.idle_timeout = idle_timeout
        self.head_timeout = head_timeout
        self.min_rate = min_rate
        self.grace = grace
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
                if owed := self.server.slots.owed():  # other workers took slow heads' slots
                    self.server.slots.repay(owed - self._drop_slow_heads(sel, owed))
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + 1.0
                    if self.parent is not None and os.getppid() != self.parent:
                        break  # a worker whose first process is gone
                    for conn in [c for c in self._conns.values() if c.deadline < now]:
                        self._drop(sel, conn, conn.why_late())  # idle, a slow head or reader
                    if self.server.slots.shared:
                        self.server.slots.offer(len(self._slow_heads(now)))
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
            if not self.server.slots.take() and not self._make_room(sel):
                self.server.turn_away(sock)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, address, 0.0)
            self._head_begins(conn, time.monotonic())  # a client sends its request at once
            self._conns[sock] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self, sel: selectors.BaseSelector) -> bool:
        """Every slot is taken: the new connection gets the slot of the head that has been
        arriving longest, if for over SLOW_HEAD seconds: this process's own (here or in a
        handler thread), else another worker's. False when there is none (503)."""
        return self._drop_slow_heads(sel, 1) == 1 or self.server.slots.claim()

    def _slow_heads(self, now: float) -> list[tuple[float, _Conn | socket.socket]]:
        """The heads of this process arriving for over SLOW_HEAD seconds, oldest first."""
        before = now - SLOW_HEAD
        heads: list[tuple[float, _Conn | socket.socket]] = [
            (c.head_started, c) for c in self._conns.values()
            if c.head_started is not None and c.head_started < before
            and c.state == "open" and not c.out and c.file is None
        ]
        heads += self.server.slow_handed(before)
        return sorted(heads, key=lambda head: head[0])

    def _drop_slow_heads(self, sel: selectors.BaseSelector, count: int) -> int:
        """Drop up to ``count`` of the oldest slow heads, keeping their slots for the
        connections they make room for; how many were dropped."""
        dropped = 0
        for _, head in self._slow_heads(time.monotonic()):
            if dropped == count:
                break
            if isinstance(head, _Conn):
                self._drop(sel, head, MADE_ROOM, give=False)
                dropped += 1
            elif self.server.drop_handed(head):
                dropped += 1
        return dropped

    def _drop(self, sel: selectors.BaseSelector, conn: _Conn, why: str | None, *,
              give: bool = True) -> None:
        if why is not None:
            self.server.slow_client(conn.address[0], why)
        self._close(sel, conn, give=give)

    def _close(self, sel: selectors.BaseSelector, conn: _Conn, *, give: bool = True) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        if conn.file is not None:
            conn.file.close()
            conn.file = None
        self.server.release(conn.sock, give=give)

    def _hand_off(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        del self._conns[conn.sock]
        sel.unregister(conn.sock)
        conn.sock.setblocking(True)
        since = conn.head_started if conn.head_started is not None else time.monotonic()
        self.server.hand_off(conn.sock, conn.address, bytes(conn.inbuf), since)

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
        if conn.head_started is None and not conn.out and conn.file is None:
            self._head_begins(conn, time.monotonic())  # later bytes never move its deadline
        conn.inbuf += data
        self._serve(sel, conn)

    def _head_begins(self, conn: _Conn, now: float) -> None:
        conn.head_started = now
        conn.deadline = now + self.head_timeout

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
            conn.head_started = None
            conn.out = memoryview(answer.head + answer.body)
            conn.file, conn.offset, conn.left = answer.file, 0, answer.count
            conn.send_started, conn.sent = time.monotonic(), 0
            if (headers.get("connection") or "").lower() == "close":
                conn.state = "close after"
            self._flush(sel, conn)

    def _flush(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        sock = conn.sock
        try:
            while conn.out:
                sent = sock.send(conn.out)
                conn.out = conn.out[sent:]
                conn.sent += sent
            while conn.file is not None and conn.left > 0:
                sent = os.sendfile(sock.fileno(), conn.file.fileno(), conn.offset, conn.left)
                if sent == 0:  # the file is shorter than it was: end the connection
                    return self._close(sel, conn)
                conn.offset += sent
                conn.left -= sent
                conn.sent += sent
        except (BlockingIOError, InterruptedError):
            now = time.monotonic()
            if too_slow(now - conn.send_started, conn.sent, self.min_rate, self.grace):
                return self._drop(sel, conn, f"reading its answer below {self.min_rate:.0f} "
                                  "bytes/s")
            conn.deadline = now + self.idle_timeout  # a stall of a whole idle timeout: dropped
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
        now = time.monotonic()
        if conn.inbuf:  # the next request (pipelined) began while this answer went out
            self._head_begins(conn, now)
        else:
            conn.deadline = now + self.idle_timeout
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
