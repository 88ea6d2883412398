"""Progress the way people and CI read it: a bar with ETA on a terminal, plain step lines with
timings in CI, and a summary at the end.

Library modules log through stdlib ``logging`` (``logging.getLogger(__name__)``, all below the
``factory`` logger) and lay their lines out themselves: a step with its time, an indented
detail, an echoed command, a subprocess's own output. The command line installs the one
handler (``configure``) that writes those lines to stderr as they are; without it (the library
used on its own) INFO records go where the application's logging sends them."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

ROOT = "factory"
# extra={"end": ""} keeps the line open: a progress bar redrawn with "\r", or a subprocess's
# line that brings its own newline.
OPEN_LINE = {"end": ""}

_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")


def _interactive(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("CI", "").lower() not in ("1", "true")


class LineHandler(logging.Handler):
    """Writes each record's message as laid out, then its ``end`` (a newline unless the record
    says otherwise); with ``timestamps``, the time first (the server's request log). Without a
    stream, whatever ``sys.stderr`` is when the record comes (tests swap it)."""

    def __init__(self, stream: TextIO | None = None, *, timestamps: bool = False) -> None:
        super().__init__(logging.DEBUG)
        self._stream = stream
        self.setFormatter(
            logging.Formatter("%(asctime)s %(message)s" if timestamps else "%(message)s")
        )

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.stream
            stream.write(self.format(record) + getattr(record, "end", "\n"))
            stream.flush()
        except Exception:
            self.handleError(record)


def configure(*, timestamps: bool = False, stream: TextIO | None = None) -> LineHandler:
    """The command line's one handler on the ``factory`` logger (replacing an earlier one)."""
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if isinstance(h, LineHandler)]:
        logger.removeHandler(old)
    handler = LineHandler(stream, timestamps=timestamps)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


def _handler_of(logger: logging.Logger) -> LineHandler | None:
    current: logging.Logger | None = logger
    while current is not None:
        for h in current.handlers:
            if isinstance(h, LineHandler):
                return h
        current = current.parent if current.propagate else None
    return None


class Log:
    """A build's progress lines on top of ``logging``: ``step`` with the time since this Log
    began, ``detail`` indented below it. With a ``stream``, the lines go to that stream only
    (one per concurrent build) through a logger of their own."""

    def __init__(self, stream: TextIO | None = None, *, name: str = "factory.build") -> None:
        if stream is None:
            self.logger = logging.getLogger(name)
        else:
            self.logger = logging.Logger(name)  # outside the hierarchy: this stream only
            self.logger.addHandler(LineHandler(stream))
            self.logger.propagate = False
        self._t0 = time.monotonic()

    @property
    def interactive(self) -> bool:
        """A terminal is watching: the handler's stream is a tty and CI is not set."""
        handler = _handler_of(self.logger)
        return handler is not None and _interactive(handler.stream)

    def step(self, text: str) -> None:
        elapsed = time.monotonic() - self._t0
        self.logger.info(f"[{elapsed:7.1f}s] {text}")

    def detail(self, text: str) -> None:
        self.logger.info(f"           {text}")


class NinjaProgress:
    """Follows a build log and reports ninja's [N/M] lines: a bar with ETA on a terminal,
    a plain line every 10 % (and at the end) otherwise."""

    def __init__(self, log_path: Path, log: Log, label: str) -> None:
        self.log_path = log_path
        self.log = log
        self.label = label
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._t0 = time.monotonic()
        self._last_decile = -1
        self.done = 0
        self.total = 0

    def __enter__(self) -> NinjaProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.log.interactive and self.total:
            self.log.logger.info("")

    def _follow(self) -> None:
        pos = 0
        while not self._stop.is_set():
            try:
                with self.log_path.open("rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
            except FileNotFoundError:
                chunk = b""
            for line in chunk.decode(errors="replace").splitlines():
                m = _NINJA_RE.match(line.strip())
                if m:
                    self.update(int(m.group(1)), int(m.group(2)))
            self._stop.wait(0.5)

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        elapsed = time.monotonic() - self._t0
        eta = elapsed / done * (total - done) if done else 0.0
        if self.log.interactive:
            width = 30
            filled = int(width * done / max(total, 1))
            bar = "#" * filled + "-" * (width - filled)
            self.log.logger.info(
                f"\r  {self.label} [{bar}] {done}/{total} {elapsed:5.0f}s ETA {eta:5.0f}s",
                extra=OPEN_LINE,
            )
            return
        decile = done * 10 // max(total, 1)
        if decile != self._last_decile or done == total:
            self._last_decile = decile
            self.log.detail(f"{self.label}: {done}/{total} objects, {elapsed:.0f}s, ETA {eta:.0f}s")
