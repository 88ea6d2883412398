"""Progress the way people and CI read it: a bar with ETA on a terminal, plain step lines with
timings in CI, and a summary at the end."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")


def _interactive(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("CI", "").lower() not in ("1", "true")


class Log:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.interactive = _interactive(self.stream)
        self._t0 = time.monotonic()

    def step(self, text: str) -> None:
        elapsed = time.monotonic() - self._t0
        print(f"[{elapsed:7.1f}s] {text}", file=self.stream, flush=True)

    def detail(self, text: str) -> None:
        print(f"           {text}", file=self.stream, flush=True)


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
            print(file=self.log.stream, flush=True)

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
            print(
                f"\r  {self.label} [{bar}] {done}/{total} {elapsed:5.0f}s ETA {eta:5.0f}s",
                end="", file=self.log.stream, flush=True,
            )
            return
        decile = done * 10 // max(total, 1)
        if decile != self._last_decile or done == total:
            self._last_decile = decile
            self.log.detail(f"{self.label}: {done}/{total} objects, {elapsed:.0f}s, ETA {eta:.0f}s")
