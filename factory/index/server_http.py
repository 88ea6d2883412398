"""HTTP for the index server: content negotiation, validators and conditional requests, byte
ranges, compression, the page cache, and the response heads the read loop writes itself.

Pure functions of the request's headers and the file's state: the read loop
(server_loop.py, through ``IndexServer.answer``) and the threaded handler (server_handler.py)
answer alike because both call these.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import email.utils
import gzip
import hashlib
import logging
import os
import re
import sys
import threading
import time
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from factory.errors import StoreError
from factory.index.pages import HTML_TYPE, JSON_TYPE
from factory.index.server_loop import header_lines
from factory.logger import ACCESS
from factory.store.base import FILE_CACHE_CONTROL, PAGE_CACHE_CONTROL
from factory.store.local import LocalStore

log = logging.getLogger("factory.index.server")

SERVER_NAME = "factory-index"
# As BaseHTTPRequestHandler.version_string() writes it: both paths send the same header.
SERVER_HEADER = f"Server: {SERVER_NAME} Python/{sys.version.split()[0]}\r\n"


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




def negotiate(accept: str | None, query_format: str | None = None) -> str | None:
    """'json', 'html', or None when nothing acceptable (PEP 691: default HTML)."""
    if query_format:
        # PEP 691 writes '?format=application/vnd.pypi.simple.v1+json' with a literal '+',
        # which a query string reads as a space; a media type never has one.
        return _NEGOTIABLE.get(query_format.replace(" ", "+"))
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
        n = _position(m.group(2))
        if n == 0 or size == 0:
            return False
        return max(0, size - n), size - 1
    first = _position(m.group(1))
    last = _position(m.group(2)) if m.group(2) else size - 1
    if first >= size or last < first:
        return False
    return first, min(last, size - 1)


_MAX_POSITION = 10**18  # beyond any file: a longer number is read as this, never parsed


def _position(digits: str) -> int:
    """A byte position of a Range header, bounded before it is parsed: int() of a number of
    thousands of digits is slow, and over 4300 it raises (a 500 and a traceback each)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else _MAX_POSITION


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


# -- response heads the read loop writes itself, as the handler would -------------------------
def head(status: HTTPStatus, headers: dict[str, str]) -> bytes:
    """A response head as the handler's send_response/send_header/end_headers write it."""
    return (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n{SERVER_HEADER}"
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


def log_access(**fields: Any) -> None:
    """One access-log line (``access_line``), marked as such for the logger."""
    log.info(access_line(**fields), extra=ACCESS)
