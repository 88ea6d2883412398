"""Receiving an upload (twine's multipart POST) without holding it in memory.

The body is parsed as it arrives: form fields are kept (small, capped), the one file part is
streamed in 1 MiB pieces to a temp file inside the store's own filesystem (a ``.tmp-<uuid>``
directory at the store root, which ``factory index verify`` reports and ``factory index rebuild``
removes if a server dies mid-upload). Its name is validated before the file is created, and the
sha256 is computed on the way. The caller checks credentials and the length before any of this.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import uuid
from email.message import Message
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import BinaryIO

from factory.errors import WheelError
from factory.wheels.checks import check_filename

CHUNK = 1024 * 1024
MAX_FIELD = 1024 * 1024  # twine sends the README as 'description'
MAX_FIELDS_TOTAL = 8 * 1024 * 1024
MAX_PART_HEADERS = 16 * 1024
TEMP_PREFIX = ".tmp-"


class UploadError(Exception):
    """A malformed upload body: the server answers 400 with this message."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReceivedUpload:
    fields: dict[str, str]
    path: Path  # <store>/.tmp-<uuid>/<filename>; remove ``path.parent`` when done
    sha256: str
    size: int

    def discard(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)


class _Body:
    """At most ``length`` bytes of the request body, read in chunks, with a look-ahead buffer."""

    def __init__(self, rfile: BinaryIO, length: int) -> None:
        self.rfile = rfile
        self.left = length
        self.buf = b""

    def fill(self) -> bool:
        if self.left <= 0:
            return False
        chunk = self.rfile.read(min(CHUNK, self.left))
        if not chunk:
            raise UploadError("the body ended before Content-Length bytes")
        self.left -= len(chunk)
        self.buf += chunk
        return True

    def until(self, marker: bytes, limit: int) -> bytes:
        """Everything before ``marker`` (consumed), at most ``limit`` bytes."""
        while (i := self.buf.find(marker)) < 0:
            if len(self.buf) > limit + len(marker):
                raise UploadError("a multipart header or field is too large")
            if not self.fill():
                raise UploadError("truncated multipart body")
        out, self.buf = self.buf[:i], self.buf[i + len(marker) :]
        if len(out) > limit:
            raise UploadError("a multipart header or field is too large")
        return out

    def stream_until(self, marker: bytes, sink: BinaryIO, limit: int) -> int:
        """Copy everything before ``marker`` to ``sink``, keeping memory to about two chunks."""
        written = 0
        keep = len(marker) - 1
        while (i := self.buf.find(marker)) < 0:
            if len(self.buf) > keep:
                piece, self.buf = self.buf[:-keep], self.buf[-keep:]
                sink.write(piece)
                written += len(piece)
                if written > limit:
                    raise UploadError("the file is larger than the upload limit")
            if not self.fill():
                raise UploadError("truncated multipart body")
        sink.write(self.buf[:i])
        written += i
        self.buf = self.buf[i + len(marker) :]
        return written

    def drain(self) -> None:
        """Read (and drop) what is left of the body: the epilogue after the last delimiter.
        Left unread, it would be taken for the next request on a keep-alive connection."""
        self.buf = b""
        while self.left > 0:
            chunk = self.rfile.read(min(CHUNK, self.left))
            if not chunk:
                raise UploadError("the body ended before Content-Length bytes")
            self.left -= len(chunk)

    def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self.fill():
                break
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


class _HashingFile:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self.f.write(data)


def boundary_of(content_type: str) -> bytes:
    msg = Message()
    msg["Content-Type"] = content_type
    if msg.get_content_type() != "multipart/form-data":
        raise UploadError("expected multipart/form-data")
    boundary = msg.get_param("boundary")
    if not isinstance(boundary, str) or not 0 < len(boundary) <= 200:
        raise UploadError("multipart/form-data without a usable boundary")
    return boundary.encode("latin-1", "replace")


def receive(
    rfile: BinaryIO, length: int, content_type: str, temp_root: Path, max_file: int
) -> ReceivedUpload:
    """Parse the body; the file part goes to a temp file under ``temp_root``.

    Raises UploadError (malformed: 400) or WheelError (a refused filename: 400), after removing
    whatever it wrote."""
    boundary = boundary_of(content_type)
    body = _Body(rfile, length)
    body.until(b"--" + boundary + b"\r\n", MAX_FIELDS_TOTAL)  # the preamble
    delimiter = b"\r\n--" + boundary
    fields: dict[str, str] = {}
    field_bytes = 0
    received: ReceivedUpload | None = None
    try:
        while True:
            headers = BytesHeaderParser().parsebytes(body.until(b"\r\n\r\n", MAX_PART_HEADERS))
            name = headers.get_param("name", header="content-disposition")
            filename = headers.get_filename()
            if name == "content" and filename is not None:
                if received is not None:
                    raise UploadError("more than one file in the upload")
                received = _receive_file(body, delimiter, str(filename), temp_root, max_file)
            else:
                value = body.until(delimiter, MAX_FIELD)
                field_bytes += len(value)
                if field_bytes > MAX_FIELDS_TOTAL:
                    raise UploadError("the form fields are too large")
                if isinstance(name, str):
                    fields[name] = value.decode("utf-8", "replace")
            after = body.take(2)
            if after == b"--":
                body.drain()
                break
            if after != b"\r\n":
                raise UploadError("malformed multipart delimiter")
    except BaseException:
        if received is not None:
            received.discard()
        raise
    if received is None:
        raise UploadError("expected :action=file_upload with a content file")
    return dataclasses.replace(received, fields=fields)


def _receive_file(
    body: _Body, delimiter: bytes, filename: str, temp_root: Path, max_file: int
) -> ReceivedUpload:
    check_filename(filename)  # before anything is written under that name
    workdir = temp_root / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
    try:
        workdir.mkdir(parents=True)
        path = workdir / filename
        with open(path, "xb") as f:
            sink = _HashingFile(f)
            size = body.stream_until(delimiter, sink, max_file)  # type: ignore[arg-type]
    except OSError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise WheelError(f"cannot store the upload: {exc.strerror}") from None
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return ReceivedUpload(fields={}, path=path, sha256=sink.sha256.hexdigest(), size=size)
