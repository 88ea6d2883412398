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
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from packaging.utils import canonicalize_name

from factory.errors import (
    AuthError,
    ConflictError,
    StoreError,
    UsageError,
    WheelError,
)
from factory.index.pages import FINDER_KEY, HTML_TYPE, JSON_TYPE
from factory.index.store.base import FILE_CACHE_CONTROL, PAGE_CACHE_CONTROL, WHEEL_VARIANTS
from factory.index.store.local import LocalStore
from factory.matrix.tags import VARIANT_RE

log = logging.getLogger("factory.index.server")

_FILE_SUFFIXES = (".whl", ".whl.metadata", ".whl.provenance.json")
_MAX_UPLOAD = 4 * 1024**3
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


@dataclasses.dataclass
class ServerStats:
    requests: int = 0
    not_found: int = 0
    auth_failures: int = 0
    uploads: int = 0
    server_errors: int = 0
    bytes_sent: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


class Credentials:
    """htpasswd checks via passlib, cached per header so read auth stays cheap under load."""

    def __init__(self, path: Path) -> None:
        from passlib.apache import HtpasswdFile

        if not path.is_file():
            raise AuthError(f"htpasswd file {path} does not exist")
        self._file = HtpasswdFile(str(path))
        self._ok: set[str] = set()
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        digest = hashlib.sha256(header.encode()).hexdigest()
        with self._lock:
            if self._file.load_if_changed():
                self._ok.clear()  # a password changed or a user was removed
            if digest in self._ok:
                return True
            try:
                user, _, password = (
                    base64.b64decode(header[6:], validate=True).decode().partition(":")
                )
            except (binascii.Error, UnicodeDecodeError):
                return False
            if self._file.check_password(user, password):
                self._ok.add(digest)
                return True
            return False


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
    gzipped: bytes | None  # None: not worth it


class PageCache:
    """Index pages in memory, re-read when the file changes (its stat differs): each page is
    hashed and compressed once per version, not once per request."""

    def __init__(self, store: LocalStore, limit: int = 4096) -> None:
        self.store = store
        self.limit = limit
        self._pages: dict[str, tuple[tuple[int, int, int], CachedPage]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> CachedPage | None:
        try:
            path = self.store.path(key)
            st = os.stat(path)
        except (StoreError, OSError):
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._pages.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        body = self.store.read(key)
        if body is None:
            return None
        page = CachedPage(
            body=body,
            etag='"' + hashlib.sha256(body).hexdigest()[:32] + '"',
            mtime=st.st_mtime,
            gzipped=gzip.compress(body, 6, mtime=0) if len(body) >= _GZIP_MIN else None,
        )
        with self._lock:
            if len(self._pages) >= self.limit:
                self._pages.clear()
            self._pages[key] = (stamp, page)
        return page


class IndexServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # resolvers arrive in bursts; the default backlog is 5

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store = LocalStore(config.store)
        self.credentials = Credentials(config.htpasswd) if config.htpasswd else None
        if config.read_auth and self.credentials is None:
            raise UsageError("read auth needs an htpasswd file (--htpasswd)")
        self.stats = ServerStats()
        self.pages = PageCache(self.store)
        super().__init__((config.host, config.port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"


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

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = urlsplit(self.path).path  # no query string: it may carry a token
        log.info('%s "%s %s" %s', self.client_address[0], self.command, path, code)

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
        split = urlsplit(self.path)
        raw_path = split.path
        parts = [unquote(p) for p in raw_path.split("/")[1:]]
        if raw_path == "/":
            return self._page("index", {"format": ["text/html"]})
        if parts and parts[0] == "files":
            return self._file(parts[1:])
        if parts[:2] == [WHEEL_VARIANTS, "files"]:
            return self._file(
                parts[2:], prefix=f"{WHEEL_VARIANTS}/files", suffixes=(".whl", "-variants.json")
            )
        query = parse_qs(split.query)
        if parts and parts[-1] in {"index.html", "index.json"}:
            return self._page_file(parts)
        if parts[:1] == [FINDER_KEY.split("/")[0]]:
            if parts != FINDER_KEY.split("/")[:1] + [""]:
                return self._redirect("/" + FINDER_KEY.rsplit("/", 1)[0] + "/")
            return self._page(FINDER_KEY.removesuffix(".html"), {"format": ["text/html"]})
        if parts and (VARIANT_RE.match(parts[0]) or parts[0] == WHEEL_VARIANTS):
            prefix, parts = parts[0] + "/", parts[1:]
            if prefix == f"{WHEEL_VARIANTS}/":
                query = {"format": ["text/html"]}  # that tree has HTML pages only
        else:
            prefix = ""
        if not parts or parts[0] != "simple":
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        rest = parts[1:]
        if not rest:  # '/simple' without the slash
            return self._redirect(f"/{prefix}simple/")
        if rest == [""]:
            return self._page(f"{prefix}simple/index", query)
        name = rest[0]
        normal = canonicalize_name(name)
        if len(rest) > 2 or (len(rest) == 2 and rest[1]):
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        if name != normal or len(rest) == 1:
            if normal and re.fullmatch(r"[a-z0-9][a-z0-9-]*", normal):
                return self._redirect(f"/{prefix}simple/{quote(normal)}/")
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        self._page(f"{prefix}simple/{normal}/index", query)

    def _page(self, base: str, query: dict[str, list[str]]) -> None:
        formats = query.get("format") or []
        kind = negotiate(self.headers.get("Accept"), formats[0] if formats else None)
        if kind is None:
            return self._text(
                HTTPStatus.NOT_ACCEPTABLE, f"acceptable: {JSON_TYPE}, {HTML_TYPE}, text/html"
            )
        accept = self.headers.get("Accept") or ""
        if kind == "json":
            ctype = JSON_TYPE
        else:
            ctype = HTML_TYPE if HTML_TYPE in accept else "text/html; charset=utf-8"
        self._cached_page(f"{base}.{kind}", ctype, vary="Accept, Accept-Encoding")

    def _page_file(self, parts: list[str]) -> None:
        """'/simple/index.html', '/<variant>/simple/<project>/index.json': the file itself, as a
        static host serves it (no negotiation)."""
        if any(not p for p in parts) or (len(parts) > 1 and parts[0] == "files"):
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        ctype = "text/html; charset=utf-8" if parts[-1].endswith(".html") else JSON_TYPE
        self._cached_page("/".join(parts), ctype, vary="Accept-Encoding")

    def _cached_page(self, key: str, ctype: str, *, vary: str) -> None:
        """A page with a strong ETag and Last-Modified (304 when the client has it), gzipped
        when the client asks and it is worth it."""
        page = self.server.pages.get(key)
        if page is None:
            return self._text(HTTPStatus.NOT_FOUND, "not found")  # and no fallback
        body, etag = page.body, page.etag
        extra = {"Vary": vary, "Cache-Control": PAGE_CACHE_CONTROL}
        if page.gzipped is not None and accepts_gzip(self.headers.get("Accept-Encoding")):
            body, etag = page.gzipped, etag[:-1] + '-gzip"'  # one strong tag per encoding
            extra["Content-Encoding"] = "gzip"
        extra["ETag"] = etag
        extra["Last-Modified"] = http_date(page.mtime)
        if not_modified(self.headers, etag, page.mtime):
            return self._not_modified(extra)
        self._send(HTTPStatus.OK, body, ctype, extra)

    def _not_modified(self, headers: dict[str, str]) -> None:
        self.send_response(HTTPStatus.NOT_MODIFIED)
        for name, value in headers.items():
            if name != "Content-Encoding":
                self.send_header(name, value)
        self.end_headers()

    def _file(
        self, parts: list[str], prefix: str = "files", suffixes: tuple[str, ...] = _FILE_SUFFIXES
    ) -> None:
        if len(parts) != 2 or not parts[1].endswith(suffixes):
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        try:
            path = self.server.store.path(f"{prefix}/{parts[0]}/{parts[1]}")
            f = open(path, "rb")  # noqa: SIM115 (closed by the with below; open errors are a 404)
        except (StoreError, OSError):
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        with f:
            self._send_file(f)

    def _send_file(self, f: Any) -> None:
        """A published file: validators, 304, one byte range (206), sendfile for the body."""
        st = os.fstat(f.fileno())
        size = st.st_size
        # Published files never change, so size and mtime identify the bytes.
        etag = f'"{size:x}-{st.st_mtime_ns:x}"'
        headers = {
            # Published files never change, so clients and CDNs may keep them.
            "Cache-Control": FILE_CACHE_CONTROL,
            "ETag": etag,
            "Last-Modified": http_date(st.st_mtime),
            "Accept-Ranges": "bytes",
        }
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
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:
            log.exception("error handling an upload")
            with contextlib.suppress(Exception):
                self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")

    def _post(self) -> None:
        if urlsplit(self.path).path not in {"/", "/legacy/", "/legacy"}:
            self.close_connection = True
            return self._text(HTTPStatus.NOT_FOUND, "not found")
        if self.server.credentials is None:
            self.close_connection = True  # the body is left unread
            return self._text(HTTPStatus.FORBIDDEN, "uploads are disabled on this server")
        if not self._authorized():
            self.close_connection = True
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            return self._text(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
        if not 0 < length <= _MAX_UPLOAD:
            self.close_connection = True
            return self._text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "upload too large")
        body = self.rfile.read(length)
        ctype = self.headers.get("Content-Type", "")
        if not ctype.startswith("multipart/form-data"):
            return self._text(HTTPStatus.BAD_REQUEST, "expected multipart/form-data")
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body
        )
        fields: dict[str, str] = {}
        content: tuple[str, bytes] | None = None
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            filename = part.get_filename()
            payload = part.get_payload(decode=True)
            if not isinstance(payload, bytes):
                payload = b""
            if name == "content" and filename:
                content = (str(filename), payload)
            elif isinstance(name, str):
                fields[name] = payload.decode("utf-8", "replace")
        if fields.get(":action", "file_upload") != "file_upload" or content is None:
            return self._text(
                HTTPStatus.BAD_REQUEST, "expected :action=file_upload with a content file"
            )
        filename, data = content
        digest = fields.get("sha256_digest")
        if digest and digest != hashlib.sha256(data).hexdigest():
            return self._text(HTTPStatus.BAD_REQUEST, "sha256_digest does not match the upload")
        self._publish(filename, data)

    def _publish(self, filename: str, data: bytes) -> None:
        from factory.index.publish import publish

        if (
            "/" in filename
            or "\\" in filename
            or filename.startswith(".")
            or not filename.endswith(".whl")
        ):
            return self._text(
                HTTPStatus.BAD_REQUEST, "only wheels with plain file names are accepted"
            )
        workdir = Path(tempfile.mkdtemp(prefix="factory-upload-"))
        try:
            path = workdir / filename
            path.write_bytes(data)
            report = publish(self.server.store, [path])
        except ConflictError as exc:
            return self._text(HTTPStatus.CONFLICT, f"File already exists: {exc.message}")
        except (WheelError, StoreError) as exc:
            return self._text(HTTPStatus.BAD_REQUEST, exc.message)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        self.server.stats.add(uploads=1)
        state = "published" if report.published else "unchanged"
        log.info("upload %s: %s", filename, state)
        self._text(HTTPStatus.OK, f"{state} {filename}")


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
