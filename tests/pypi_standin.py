"""A PyPI stand-in on loopback: what the factory and pip read from PyPI and PyTorch's indexes,
served from files on this machine, with releases that can appear while it runs.

- ``/simple/<project>/``: PEP 691 JSON (when asked for) or PEP 503 HTML, with sha256,
  requires-python, upload times and PEP 658/714 ``core-metadata``;
- ``/files/<filename>`` with HTTP range requests (what a lazy METADATA read needs), and
  ``/files/<filename>.metadata`` where PEP 658 is on;
- ``/whl/<cu tag>/torch/``: PyTorch-style per-CUDA pages (HTML, ``+cuXYZ`` local versions).

``fake_release`` makes a torch release that never was (e.g. 2.99.0) out of a real wheel by
rewriting its version and nothing else: the build and import stay real and offline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import html
import http.server
import json
import os
import re
import shutil
import struct
import threading
import urllib.parse
import zipfile
import zlib
from pathlib import Path
from typing import Any

from http_fixtures import serving
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

from factory.wheels.provenance import sha256_file


@dataclasses.dataclass
class File:
    filename: str
    path: Path
    sha256: str
    upload_time: str
    metadata: bytes | None  # served as <file>.metadata when PEP 658 is on
    requires_python: str | None


def _wheel_metadata(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist()
                    if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return zf.read(name)


def _requires_python(metadata: bytes) -> str | None:
    m = re.search(rb"^Requires-Python: *(.+?)\s*$", metadata, re.M)
    return m.group(1).decode() if m else None


class StandIn:
    """The index's content; ``serve()`` puts it on a loopback port."""

    def __init__(self, *, pep658: bool = True, hashes: dict[str, str] | None = None) -> None:
        self.pep658 = pep658
        self.projects: dict[str, dict[str, File]] = {}
        self.pytorch: dict[str, dict[str, File]] = {}  # cu tag -> filename -> file
        self.hashes = hashes if hashes is not None else {}  # path -> sha256, to hash once
        self.lock = threading.Lock()
        self.requests: list[str] = []

    def _file(self, path: Path, upload_time: str | None) -> File:
        key = f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}"
        if key not in self.hashes:
            self.hashes[key] = sha256_file(path)
        meta = _wheel_metadata(path) if path.name.endswith(".whl") else None
        return File(filename=path.name, path=path, sha256=self.hashes[key],
                    upload_time=upload_time or "2026-11-01T00:00:00Z", metadata=meta,
                    requires_python=_requires_python(meta) if meta else None)

    def add(self, path: Path, *, upload_time: str | None = None) -> None:
        """Publish ``path`` (a wheel or an sdist) under its project."""
        if path.name.endswith(".whl"):
            project = parse_wheel_filename(path.name)[0]
        else:
            project = parse_sdist_filename(path.name)[0]
        f = self._file(path, upload_time)
        with self.lock:
            self.projects.setdefault(canonicalize_name(project), {})[path.name] = f

    def add_pytorch(self, cuda_tag: str, path: Path) -> None:
        f = self._file(path, None)
        with self.lock:
            self.pytorch.setdefault(cuda_tag, {})[path.name] = f

    # -- pages ----------------------------------------------------------------------------
    def page(self, project: str, *, as_json: bool) -> bytes | None:
        with self.lock:
            files = sorted(self.projects.get(canonicalize_name(project), {}).values(),
                           key=lambda f: f.filename)
        if not files:
            return None
        if as_json:
            return json.dumps({
                "meta": {"api-version": "1.1"}, "name": canonicalize_name(project),
                "versions": [],
                "files": [{
                    "filename": f.filename, "url": f"../../files/{f.filename}",
                    "hashes": {"sha256": f.sha256}, "requires-python": f.requires_python,
                    "upload-time": f.upload_time, "yanked": False,
                    "size": f.path.stat().st_size,
                    "core-metadata": ({"sha256": hashlib.sha256(f.metadata).hexdigest()}
                                      if self.pep658 and f.metadata else False),
                } for f in files],
            }).encode()
        return _html(files, prefix="../../files/", pep658=self.pep658)

    def pytorch_page(self, tag: str) -> bytes | None:
        with self.lock:
            files = sorted(self.pytorch.get(tag, {}).values(), key=lambda f: f.filename)
        return _html(files, prefix="", pep658=self.pep658) if files else None

    def find(self, filename: str) -> File | None:
        with self.lock:
            for group in (*self.projects.values(), *self.pytorch.values()):
                if filename in group:
                    return group[filename]
        return None

    def serve(self) -> contextlib.AbstractContextManager[str]:
        """Serve on a free loopback port; the root URL ('http://127.0.0.1:N/')."""
        return serving(_handler(self))


def _html(files: list[File], *, prefix: str, pep658: bool) -> bytes:
    rows = []
    for f in files:
        attrs = f'href="{prefix}{urllib.parse.quote(f.filename)}#sha256={f.sha256}"'
        if f.requires_python:
            attrs += f' data-requires-python="{html.escape(f.requires_python)}"'
        if pep658 and f.metadata:
            digest = hashlib.sha256(f.metadata).hexdigest()
            attrs += f' data-core-metadata="sha256={digest}"'
            attrs += f' data-dist-info-metadata="sha256={digest}"'
        rows.append(f"<a {attrs}>{html.escape(f.filename)}</a><br/>")
    return ("<!DOCTYPE html><html><body>\n" + "\n".join(rows) + "\n</body></html>\n").encode()


def _handler(standin: StandIn) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            standin.requests.append(path)
            m = re.fullmatch(r"/simple/([^/]+)/?", path)
            if m:
                as_json = "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
                body = standin.page(m.group(1), as_json=as_json)
                ctype = ("application/vnd.pypi.simple.v1+json" if as_json
                         else "application/vnd.pypi.simple.v1+html")
                return self._send(body, ctype)
            m = re.fullmatch(r"/whl/(cu\d+)/torch/?", path)
            if m:
                return self._send(standin.pytorch_page(m.group(1)), "text/html")
            name = path.rsplit("/", 1)[-1]
            if name.endswith(".metadata"):
                f = standin.find(name[: -len(".metadata")])
                return self._send(f.metadata if (f and standin.pep658) else None, "text/plain")
            f = standin.find(name)
            if f is None or not (path.startswith("/files/") or path.startswith("/whl/")):
                return self._send(None, "text/plain")
            self._file(f.path)

        def _send(self, body: bytes | None, ctype: str) -> None:
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, path: Path) -> None:
            size = path.stat().st_size
            start, end = 0, size - 1
            spec = self.headers.get("Range")
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", spec or "")
            if m:
                if m.group(1):
                    start = int(m.group(1))
                    end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                else:
                    start = max(0, size - int(m.group(2)))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            with open(path, "rb") as fh:
                fh.seek(start)
                left = end - start + 1
                while left > 0:
                    chunk = fh.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


# -- a release that never was ---------------------------------------------------------------------

def fake_release(wheel: Path, version: str, dest: Path) -> Path:
    """``wheel`` as release ``version`` of its project: the dist-info renamed, METADATA's
    Version, RECORD's paths and (torch) ``torch/version.py`` rewritten; every other member
    copied as its compressed bytes (a 550 MB torch wheel in seconds). Made once per target."""
    name, old, _, _ = parse_wheel_filename(wheel.name)
    dist = wheel.name.split("-")[0]
    target = dest / wheel.name.replace(f"{dist}-{old}-", f"{dist}-{version}-", 1)
    if target.exists() and target.stat().st_size > 0:
        return target
    dest.mkdir(parents=True, exist_ok=True)
    old_info, new_info = f"{dist}-{old}.dist-info/", f"{dist}-{version}.dist-info/"
    tmp = target.with_name(f".{target.name}.partial")
    with zipfile.ZipFile(wheel) as zf, open(wheel, "rb") as raw, open(tmp, "wb") as out:
        central: list[bytes] = []
        record_rows: list[str] = []
        deferred: list[tuple[zipfile.ZipInfo, str]] = []
        for info in zf.infolist():
            new_name = info.filename.replace(old_info, new_info, 1)
            if new_name == f"{new_info}RECORD":
                deferred.append((info, new_name))
                continue
            data = None
            if new_name == f"{new_info}METADATA":
                data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(),
                              zf.read(info), count=1, flags=re.M)
            elif canonicalize_name(name) == "torch" and new_name == "torch/version.py":
                data = re.sub(rb"^__version__ = .*$", f"__version__ = '{version}'".encode(),
                              zf.read(info), count=1, flags=re.M)
            if data is not None:
                central.append(_write_member(out, new_name, info, data=data))
                digest = hashlib.sha256(data).digest()
                record_rows.append(f"{new_name},sha256={_b64(digest)},{len(data)}")
            else:
                central.append(_write_member(out, new_name, info, raw=raw))
                record_rows.append("")
        for info, new_name in deferred:
            record = _rewrite_record(zf.read(info).decode(), old_info, new_info,
                                     [r for r in record_rows if r])
            central.append(_write_member(out, new_name, info, data=record.encode()))
        offset = out.tell()
        for entry in central:
            out.write(entry)
        size = out.tell() - offset
        out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), size,
                              offset, 0))
    os.replace(tmp, target)
    return target


def _b64(digest: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _rewrite_record(text: str, old_info: str, new_info: str, changed: list[str]) -> str:
    by_path = {row.split(",", 1)[0]: row for row in changed}
    out = []
    for line in text.splitlines():
        if not line:
            continue
        path = line.split(",", 1)[0].replace(old_info, new_info, 1)
        out.append(by_path.get(path, path + "," + line.split(",", 1)[1]))
    return "\n".join(out) + "\n"


def _write_member(out: Any, name: str, info: zipfile.ZipInfo, *, raw: Any = None,
                  data: bytes | None = None) -> bytes:
    """Write one member's local header and data; return its central directory entry."""
    encoded = name.encode()
    if data is not None:
        method = zipfile.ZIP_DEFLATED
        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        payload = comp.compress(data) + comp.flush()
        crc, size = zlib.crc32(data), len(data)
    else:
        method = info.compress_type
        raw.seek(info.header_offset)
        header = raw.read(30)
        n, e = struct.unpack("<HH", header[26:30])
        raw.seek(info.header_offset + 30 + n + e)
        payload = raw.read(info.compress_size)
        crc, size = info.CRC, info.file_size
    if len(payload) >= 0xFFFFFFFF or size >= 0xFFFFFFFF:
        raise ValueError(f"{name}: members over 4 GiB need zip64")
    offset = out.tell()
    dostime = info.date_time
    t = (dostime[3] << 11) | (dostime[4] << 5) | (dostime[5] // 2)
    d = ((dostime[0] - 1980) << 9) | (dostime[1] << 5) | dostime[2]
    flags = 0x800 if any(b > 127 for b in encoded) else 0
    out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, flags, method, t, d, crc,
                          len(payload), size, len(encoded), 0))
    out.write(encoded)
    out.write(payload)
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, (3 << 8) | 20, 20, flags, method, t,
                       d, crc, len(payload), size, len(encoded), 0, 0, 0, 0,
                       info.external_attr, offset) + encoded


def copy_tree_linked(src: Path, dest: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """``dest`` with every file of ``src`` hard-linked (copied across filesystems), but those
    named in ``skip`` (files written in place, which a link would share)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in skip and not (dest / f.name).exists():
            try:
                os.link(f, dest / f.name)
            except OSError:
                shutil.copy2(f, dest / f.name)
    return dest


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
