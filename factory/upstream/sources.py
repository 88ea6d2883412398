"""Reading the public indexes: live over HTTP, through a directory of recorded responses (the
cache under the work dir, or a recording kept with the tests), or both.

Two kinds of reads, because they age differently:

- ``page``: a project's simple page (PEP 691 JSON or PEP 503 HTML), which changes with every
  release; a cached page is used while it is younger than the cache's ``max_age``.
- ``metadata``: one wheel's core metadata, which never changes for a file: PEP 658's
  ``<wheel>.metadata`` where the index serves it, else the ``METADATA`` member read out of the
  wheel with HTTP range requests (its zip directory and that one member, a few hundred KiB of a
  500 MB torch wheel). Either way it is recorded under ``<wheel url>.metadata`` with ``via``
  saying which, so a recording is the same whatever the index offered.

A recorded response is two files, ``<name>.json`` (url, status, type, when, how) and
``<name>.body.gz`` (gzip with no timestamp, so the same response gives the same bytes).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import os
import re
import struct
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path
from typing import Protocol

from factory.errors import UpstreamError

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
PAGE_ACCEPT = f"{JSON_ACCEPT}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
# Answers that mean "there is no such page" (PyTorch's S3-backed host says 403 for those).
ABSENT = frozenset({403, 404, 410})
_TAIL = 256 * 1024  # the first range read: the end of the wheel, where the zip directory is


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Response:
    url: str  # what was asked for; for metadata, '<wheel url>.metadata'
    status: int  # 200, or one of ABSENT
    body: bytes
    content_type: str = ""
    fetched: str  # when the index answered (ISO 8601, UTC)
    via: str = "get"  # "get", "pep658" or "range" (metadata read out of the wheel)
    origin: str = "live"  # how this process got it: "live", "cache" or "recording"

    @property
    def ok(self) -> bool:
        return self.status == 200

    def age_seconds(self, now: float | None = None) -> float:
        return (now if now is not None else time.time()) - parse_iso(self.fetched).timestamp()


class Source(Protocol):
    def page(self, url: str) -> Response: ...

    def metadata(self, wheel_url: str, *, pep658: bool) -> Response: ...


class LiveSource:
    """The indexes over HTTP. A host that cannot be reached once is not asked again in this
    process (one unreachable host costs one timeout, not one per page)."""

    def __init__(self, *, timeout: float = 30) -> None:
        self.timeout = timeout
        self._down: dict[str, str] = {}

    def page(self, url: str) -> Response:
        status, body, ctype = self._get(url, {"Accept": PAGE_ACCEPT})
        return Response(url=url, status=status, body=body, content_type=ctype, fetched=now_iso())

    def metadata(self, wheel_url: str, *, pep658: bool) -> Response:
        url = wheel_url + ".metadata"
        if pep658:
            status, body, ctype = self._get(url, {"Accept": "*/*"})
            if status == 200:
                return Response(url=url, status=200, body=body, content_type=ctype,
                                fetched=now_iso(), via="pep658")
        body = metadata_by_range(lambda a, b: self._range(wheel_url, a, b), wheel_url)
        return Response(url=url, status=200, body=body, content_type="text/plain",
                        fetched=now_iso(), via="range")

    # -- HTTP ------------------------------------------------------------------------------
    def _open(self, url: str, headers: dict[str, str]) -> tuple[int, bytes, str, dict[str, str]]:
        host = urllib.parse.urlsplit(url).netloc
        if host in self._down:
            raise UpstreamError(f"cannot reach {host}: {self._down[host]}")
        request = urllib.request.Request(url, headers={"User-Agent": "cuda-wheel-factory",
                                                       **headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                headers = {k.lower(): v for k, v in resp.headers.items()}
                return resp.status, resp.read(), headers.get("content-type", ""), headers
        except urllib.error.HTTPError as exc:
            if exc.code in ABSENT:
                return exc.code, b"", "", {}
            raise UpstreamError(f"{host} answered HTTP {exc.code} for {url}") from None
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            reason = str(getattr(exc, "reason", exc))
            self._down[host] = reason
            raise UpstreamError(f"cannot reach {host}: {reason}") from None

    def _get(self, url: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
        status, body, ctype, _ = self._open(url, headers)
        return status, body, ctype

    def _range(self, url: str, start: int | None, end: int | None) -> tuple[bytes, int]:
        """Bytes ``start..end`` (inclusive) of ``url``, or the last ``end`` bytes when ``start``
        is None; and the file's total size."""
        spec = f"bytes=-{end}" if start is None else f"bytes={start}-{end}"
        status, body, _, headers = self._open(url, {"Range": spec})
        if status != 206:
            raise UpstreamError(f"{url}: the server does not answer range requests "
                                f"(HTTP {status}), and serves no PEP 658 metadata")
        total = re.search(r"/(\d+)$", headers.get("content-range", ""))
        if not total:
            raise UpstreamError(f"{url}: a range answer without a Content-Range size")
        return body, int(total.group(1))


# -- METADATA out of a wheel, by range requests ----------------------------------------------

def metadata_by_range(read: RangeReader, url: str) -> bytes:
    """The ``*.dist-info/METADATA`` member of the wheel at ``url``, read with two or three range
    requests: the tail (end of central directory and, usually, the directory itself), the
    directory if it did not fit, and the member's local header and data."""
    tail, size = read(None, _TAIL)
    tail_start = size - len(tail)
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0 or len(tail) < eocd + 22:
        raise UpstreamError(f"{url}: no zip directory at the end of the file")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12:eocd + 20])
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:  # zip64
        loc = tail.rfind(b"PK\x06\x06")
        if loc < 0:
            raise UpstreamError(f"{url}: a zip64 file without its zip64 directory record")
        cd_size, cd_offset = struct.unpack("<QQ", tail[loc + 40:loc + 56])
    if cd_offset >= tail_start:
        directory = tail[cd_offset - tail_start:cd_offset - tail_start + cd_size]
    else:
        directory, _ = read(cd_offset, cd_offset + cd_size - 1)
    entry = _find_metadata(directory, url)
    name_len, method, csize, offset = entry
    want = 30 + name_len + 1024 + csize  # local extra fields are short
    if offset >= tail_start and offset + want <= size:
        local = tail[offset - tail_start:offset - tail_start + want]
    else:
        local, _ = read(offset, min(size - 1, offset + want - 1))
    if local[:4] != b"PK\x03\x04":
        raise UpstreamError(f"{url}: no local zip header where the directory points")
    n, e = struct.unpack("<HH", local[26:30])
    data = local[30 + n + e:30 + n + e + csize]
    if len(data) < csize:
        data += read(offset + 30 + n + e + len(data), offset + 30 + n + e + csize - 1)[0]
    if method == 0:
        return data
    if method == 8:
        try:
            return zlib.decompress(data, -15)
        except zlib.error as exc:
            raise UpstreamError(f"{url}: METADATA does not inflate: {exc}") from None
    raise UpstreamError(f"{url}: METADATA is compressed with zip method {method}")


class RangeReader(Protocol):
    def __call__(self, start: int | None, end: int) -> tuple[bytes, int]: ...


def _find_metadata(directory: bytes, url: str) -> tuple[int, int, int, int]:
    """(name length, method, compressed size, local header offset) of the top-level
    ``*.dist-info/METADATA`` entry."""
    p = 0
    while p + 46 <= len(directory):
        if directory[p:p + 4] != b"PK\x01\x02":
            break
        method = struct.unpack("<H", directory[p + 10:p + 12])[0]
        csize = struct.unpack("<I", directory[p + 20:p + 24])[0]
        n, e, c = struct.unpack("<HHH", directory[p + 28:p + 34])
        offset = struct.unpack("<I", directory[p + 42:p + 46])[0]
        name = directory[p + 46:p + 46 + n].decode("utf-8", "replace")
        if name.count("/") == 1 and name.endswith(".dist-info/METADATA"):
            if csize == 0xFFFFFFFF or offset == 0xFFFFFFFF:
                csize, offset = _zip64_extra(directory[p + 46 + n:p + 46 + n + e], csize, offset)
            return n, method, csize, offset
        p += 46 + n + e + c
    raise UpstreamError(f"{url}: no .dist-info/METADATA in the wheel's zip directory")


def _zip64_extra(extra: bytes, csize: int, offset: int) -> tuple[int, int]:
    p = 0
    while p + 4 <= len(extra):
        tag, length = struct.unpack("<HH", extra[p:p + 4])
        if tag == 1:
            fields = extra[p + 4:p + 4 + length]
            values = list(struct.unpack(f"<{len(fields) // 8}Q", fields[:len(fields) // 8 * 8]))
            # order: uncompressed size, compressed size, offset (each only when it overflowed)
            if values:
                values.pop(0)  # the uncompressed size is always first when present
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
            return csize, offset
        p += 4 + length
    return csize, offset


# -- recorded responses ------------------------------------------------------------------------

def _slug(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    tail = "_".join(p for p in parts.path.split("/") if p)[-80:]
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", f"{parts.hostname or 'local'}_{tail}")
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return f"{name}-{digest}"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record(root: Path, response: Response) -> None:
    """Write ``response`` into the directory ``root`` (created); the same response gives the
    same two files."""
    root.mkdir(parents=True, exist_ok=True)
    name = _slug(response.url)
    meta = {"url": response.url, "status": response.status,
            "content_type": response.content_type, "fetched": response.fetched,
            "via": response.via}
    _write_atomic(root / f"{name}.body.gz", gzip.compress(response.body, mtime=0))
    _write_atomic(root / f"{name}.json",
                  (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())


def recorded(root: Path, url: str, *, origin: str) -> Response | None:
    """The response recorded for ``url`` in ``root``, or None (also for an unreadable one)."""
    name = _slug(url)
    try:
        meta = json.loads((root / f"{name}.json").read_text())
        body = gzip.decompress((root / f"{name}.body.gz").read_bytes())
    except (OSError, ValueError, EOFError, gzip.BadGzipFile):
        return None
    if not isinstance(meta, dict) or meta.get("url") != url:
        return None
    try:
        return Response(url=url, status=int(meta["status"]), body=body,
                        content_type=str(meta.get("content_type", "")),
                        fetched=str(meta["fetched"]), via=str(meta.get("via", "get")),
                        origin=origin)
    except (KeyError, TypeError, ValueError):
        return None


class DirectorySource:
    """Recorded responses in a directory, in front of another source (or none).

    - ``upstream`` None: replay only; a response that was not recorded is an UpstreamError,
      and so is one recorded as unreachable (status 0, the reason as its body).
    - with ``upstream``: a page younger than ``max_age`` seconds (None: any age) and any
      metadata come from the directory; everything else is asked upstream and recorded, an
      unreachable host as such. With ``stale_ok`` (the cache), a page upstream cannot answer
      falls back to the recorded one, however old, and ``unreachable`` says so.
    """

    def __init__(self, root: Path, upstream: Source | None = None, *,
                 max_age: float | None = None, label: str = "cache",
                 stale_ok: bool = True) -> None:
        self.root = root
        self.upstream = upstream
        self.max_age = max_age
        self.label = label
        self.stale_ok = stale_ok
        self.unreachable: dict[str, str] = {}  # host -> why, for pages served stale
        self.used: set[str] = set()

    def page(self, url: str) -> Response:
        self.used.add(_slug(url))
        have = recorded(self.root, url, origin=self.label)
        if self.upstream is None:
            if have is None:
                raise UpstreamError(f"no recorded response for {url} in {self.root}")
            if have.status == 0:
                raise UpstreamError(have.body.decode("utf-8", "replace"))
            return have
        usable = have is not None and have.status != 0
        if usable and have is not None and (self.max_age is None
                                            or have.age_seconds() <= self.max_age):
            return have
        try:
            got = self.upstream.page(url)
        except UpstreamError as exc:
            if usable and have is not None and self.stale_ok:
                self.unreachable[urllib.parse.urlsplit(url).netloc] = exc.message
                return have
            record(self.root, Response(url=url, status=0, body=exc.message.encode(),
                                       fetched=now_iso()))
            raise
        record(self.root, got)
        return got

    def metadata(self, wheel_url: str, *, pep658: bool) -> Response:
        url = wheel_url + ".metadata"
        self.used.add(_slug(url))
        have = recorded(self.root, url, origin=self.label)
        if have is not None and have.status == 200:
            return have
        if self.upstream is None:
            raise UpstreamError(f"no recorded metadata for {wheel_url} in {self.root}")
        got = self.upstream.metadata(wheel_url, pep658=pep658)
        record(self.root, got)
        return got

    def prune(self) -> list[str]:
        """Remove the recorded responses this source was not asked for (a re-recording leaves
        exactly what the facts were read from)."""
        gone = []
        for path in sorted(self.root.glob("*.json")):
            name = path.name[: -len(".json")]
            if name not in self.used and (self.root / f"{name}.body.gz").exists():
                path.unlink()
                (self.root / f"{name}.body.gz").unlink()
                gone.append(name)
        return gone
