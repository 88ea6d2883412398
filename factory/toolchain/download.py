"""A download read in chunks behind the one progress line (``logger.Ticker``): the file, how much
of how much, the rate and the time; a redrawn line on a terminal, a line at most every 30 s in
CI. A download done within ``QUIET_SECONDS`` prints nothing (the manifests, small sdists)."""

from __future__ import annotations

import time
from email.message import Message
from typing import Protocol

from factory.logger import Log, Ticker
from factory.units import format_duration, format_size

CHUNK = 1 << 20
QUIET_SECONDS = 1.0


class Readable(Protocol):
    """What ``urllib.request.urlopen`` answers with."""

    @property
    def headers(self) -> Message: ...

    def read(self, amt: int, /) -> bytes: ...


class ByteProgress:
    """How far one download is: ``render`` is the Ticker's line."""

    def __init__(self, what: str, total: int | None) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.t0 = time.monotonic()

    def render(self) -> str | None:
        elapsed = time.monotonic() - self.t0
        if elapsed < QUIET_SECONDS:
            return None
        got = format_size(self.done)
        if self.total:
            got += f" of {format_size(self.total)} ({100 * self.done // self.total} %)"
        rate = format_size(self.done / elapsed)
        return f"{self.what}: {got}, {rate}/s, {format_duration(elapsed)}"


def read_with_progress(resp: Readable, what: str) -> bytes:
    """The whole body of ``resp``, read ``CHUNK`` bytes at a time with a progress line."""
    length = resp.headers.get("Content-Length") or ""
    progress = ByteProgress(what, int(length) if length.isdigit() else None)
    parts: list[bytes] = []
    with Ticker(Log(name=__name__), progress.render):
        while block := resp.read(CHUNK):
            parts.append(block)
            progress.done += len(block)
    return b"".join(parts)
