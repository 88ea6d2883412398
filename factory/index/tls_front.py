"""https for `factory serve --tls-cert FILE --tls-key FILE`: a TLS front on the public address
that forwards each connection's bytes to the plain index server on a loopback port.

Why a front and not TLS inside the server: the server's read loop answers from non-blocking
plain sockets and sends wheels with ``sendfile`` (``factory/index/server_loop.py``); TLS there
would mean a second code path through every answer. The front is one asyncio loop in a process
of its own (forked before the server starts any thread), so the server stays exactly what is
tested over http, and a client sees one https server. For heavy use, put a reverse proxy that
terminates TLS in front of the plain server instead (docs/DEPLOY.md): the same split, in nginx.

The server sees every client as 127.0.0.1; the front logs nothing itself (the server's request
log says what was asked).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

from factory.errors import UsageError

_CHUNK = 256 * 1024
_HANDSHAKE_SECONDS = 30.0


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context from a PEM certificate chain and its key; UsageError in one line."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except FileNotFoundError as exc:
        raise UsageError(f"cannot read {exc.filename or cert}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot use the TLS certificate {cert} with the key {key}: "
                         f"{getattr(exc, 'reason', None) or exc}") from None
    return ctx


def listen(host: str, port: int) -> socket.socket:
    try:
        return socket.create_server((host, port), backlog=1024, reuse_port=False)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                half_close: bool) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if half_close and writer.can_write_eof():
            writer.write_eof()  # the client is done sending: the server may still answer
            return
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    writer.close()


async def _connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                      upstream: tuple[str, int]) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*upstream)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(
        _pipe(client_reader, up_writer, half_close=True),
        _pipe(up_reader, client_writer, half_close=False),
    )
    for w in (up_writer, client_writer):
        w.close()
        with contextlib.suppress(Exception):
            await w.wait_closed()


async def _serve(sock: socket.socket, ctx: ssl.SSLContext, upstream: tuple[str, int],
                 parent: int) -> None:
    server = await asyncio.start_server(
        lambda r, w: _connection(r, w, upstream), sock=sock, ssl=ctx,
        ssl_handshake_timeout=_HANDSHAKE_SECONDS, limit=_CHUNK,
    )
    async with server:
        while os.getppid() == parent:  # the server process is gone: so is its front
            await asyncio.sleep(1.0)


def start_front(sock: socket.socket, ctx: ssl.SSLContext, upstream: tuple[str, int],
                *, close_in_child: tuple[socket.socket, ...] = ()) -> int:
    """Fork the front (call it before the server starts threads); returns the child's pid.
    The child serves until the calling process ends or sends it SIGTERM."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C goes to the server, which ends us
        for other in close_in_child:
            other.close()
        asyncio.run(_serve(sock, ctx, upstream, parent))
    except BaseException as exc:  # noqa: BLE001 - a child process reports and exits
        print(f"ERROR the TLS front ended: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        os._exit(code)


def stop_front(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
