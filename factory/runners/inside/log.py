"""The build's log: every byte to the log file and to stdout as it comes."""

from __future__ import annotations

import sys
import threading
from pathlib import Path


class Log:
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "ab")  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._fh.write(data)
            self._fh.flush()
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except (BrokenPipeError, OSError):
                pass  # nobody is listening any more; the log file still has it

    def line(self, text: str) -> None:
        self.write((text + "\n").encode())

