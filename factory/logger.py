"""Progress the way people and CI read it: a bar with ETA on a terminal, plain step lines with
timings in CI (a progress line at most every 30 s), and a summary at the end.

Library modules log through stdlib ``logging`` (``logging.getLogger(__name__)``, all below the
``factory`` logger) and lay their lines out themselves: a step with its time, an indented
detail, an echoed command, a subprocess's own output. The command line installs the one
handler (``configure``) that writes those lines to stderr as they are; without it (the library
used on its own) INFO records go where the application's logging sends them.

While a cell is built (``cell_lines``), every line outside a terminal starts with the cell's
short id, so the lines of builds running side by side in one CI job can be told apart; on
GitHub Actions the cell's lines fold into one group (factory.actions)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from factory import actions
from factory.errors import FactoryError, Interrupted

ROOT = "factory"
# extra={"end": ""} keeps the line open: a progress bar redrawn with "\r", or a subprocess's
# line that brings its own newline.
OPEN_LINE = {"end": ""}
# extra={"bare": True}: a line written as it is, never prefixed (a workflow command)
BARE = {"bare": True}
# extra={"access": True}: a request log line that carries its own time (Combined Log Format):
# no timestamp in front of it
ACCESS = {"access": True, "bare": True}
CI_INTERVAL = 30.0  # at most one progress line this often outside a terminal
TTY_INTERVAL = 1.0  # a redrawn bar this often on a terminal
DETAIL_INDENT = " " * 11  # a detail line sits under its step's text ("[  12.3s] ")

_CELL: contextvars.ContextVar[str | None] = contextvars.ContextVar("factory_cell", default=None)


def _interactive(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("CI", "").lower() not in ("1", "true")


@contextlib.contextmanager
def naming_cell(short_id: str) -> Iterator[None]:
    """Lines written inside start with the cell's short id (outside a terminal); an error that
    leaves carries it (``FactoryError.cell``), so the CLI's ERROR lines name the cell too."""
    token = _CELL.set(short_id)
    try:
        yield
    except (FactoryError, Interrupted) as exc:
        if exc.cell is None:
            exc.cell = short_id
        raise
    finally:
        _CELL.reset(token)


@contextlib.contextmanager
def cell_lines(short_id: str, title: str | None = None) -> Iterator[None]:
    """A cell's build: its lines name the cell (``naming_cell``); on GitHub Actions they fold
    into one group titled ``title`` (the full cell id)."""
    group = actions.groups_enabled()
    log = logging.getLogger(ROOT)
    if group:
        log.info(actions.group_start(title or short_id), extra=BARE)
    try:
        with naming_cell(short_id):
            yield
    finally:
        if group:
            log.info(actions.group_end(), extra=BARE)


def cell_line(text: str, cell: str | None, stream: TextIO) -> str:
    """``text`` as a line of ``cell`` (its short id in front of each line) where lines name their
    cell: on ``stream`` when it is no terminal."""
    if not cell or _interactive(stream):
        return text
    return "".join(f"[{cell}] {line}" if line.strip() else line
                   for line in text.splitlines(keepends=True))


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
            text = record.getMessage() if getattr(record, "access", False) else self.format(record)
            if not getattr(record, "bare", False):
                text = cell_line(text, _CELL.get(), stream)
            stream.write(text + getattr(record, "end", "\n"))
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
        self.logger.info(f"{DETAIL_INDENT}{text}")

    def error(self, text: str, *, title: str | None = None) -> None:
        """A step line that says something failed; on GitHub Actions also an annotation."""
        self.step(text)
        if actions.on_actions():
            self.logger.info(actions.error_annotation(text, title=title), extra=BARE)


class Ticker:
    """Calls ``render`` in a thread and shows what it returns: a line redrawn every second on a
    terminal, a plain line at most every ``CI_INTERVAL`` seconds elsewhere, and the last one
    when it stops. ``render`` returns None while there is nothing to say yet. The thread
    carries the caller's context (the cell its lines name)."""

    def __init__(self, log: Log, render: Callable[[], str | None], *,
                 ci_interval: float = CI_INTERVAL) -> None:
        self.log = log
        self.render = render
        self.ci_interval = ci_interval
        self._stop = threading.Event()
        self._context = contextvars.copy_context()
        self._thread = threading.Thread(target=self._context.run, args=(self._run,),
                                        daemon=True)
        self._open = False  # a redrawn line is on the terminal
        self._last_line = 0.0
        self._last_text: str | None = None

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._context.run(self._show, True)

    def _run(self) -> None:
        interactive = self.log.interactive
        while not self._stop.wait(TTY_INTERVAL if interactive else 0.5):
            self._show(False)

    def _show(self, final: bool) -> None:
        try:
            text = self.render()
        except Exception as exc:  # a progress line must never stop a build
            text = f"(progress unavailable: {type(exc).__name__}: {exc})"
        if self.log.interactive:
            if text is not None:
                pad = max(0, len(self._last_text or "") - len(text))
                self.log.logger.info(f"\r{DETAIL_INDENT}{text}{' ' * pad}", extra=OPEN_LINE)
                self._open, self._last_text = True, text
            if final and self._open:
                self.log.logger.info("")
                self._open = False
            return
        now = time.monotonic()
        due = now - self._last_line >= self.ci_interval
        if text is not None and (due or final) and text != self._last_text:
            self.log.detail(text)
            self._last_line, self._last_text = now, text
