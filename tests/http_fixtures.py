"""Small HTTP servers on loopback for tests (a PEP 503 page, a mirror directory)."""

from __future__ import annotations

import contextlib
import http.server
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def serving(handler: Callable[..., http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port; yields the base URL ("http://127.0.0.1:N/")."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def pages(
    content: Mapping[str, bytes] | Callable[[str], bytes | None],
) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler answering GET ``path`` with ``content[path]`` (or ``content(path)``), 404 when
    that is None, quietly."""
    lookup = content.get if isinstance(content, Mapping) else content

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = lookup(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def trickling(body: bytes, *, pieces: int, pause: float, length: bool = True
              ) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler answering every GET with ``body`` in ``pieces`` parts, ``pause`` seconds apart
    (a slow download); without ``length`` no Content-Length (the body ends with the
    connection), quietly."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            if length:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            step = -(-len(body) // pieces)
            for at in range(0, len(body), step):
                self.wfile.write(body[at:at + step])
                self.wfile.flush()
                time.sleep(pause)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def factory_serve(store: Path, *args: str) -> Iterator[str]:
    """The real `factory serve --store STORE --port 0 ARGS` in a subprocess; yields the index URL
    it prints ("http://127.0.0.1:PORT/", "https://NAME:PORT/"), stops it on exit."""
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-m", "factory", "serve", "--store", str(store), "--port", "0", *args],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "serving STORE at URLsimple/ (per variant: ...)"
        match = re.search(r" at (https?://\S+/)simple/ ", first)
        assert match, f"factory serve did not start: {first!r}"
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
