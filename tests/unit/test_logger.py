"""The one output handler: library modules log through `logging`, the CLI's handler writes the
lines as laid out (steps, details, echoed commands, raw subprocess output, the progress bar)."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from factory import logger
from factory.cli import main
from factory.logger import OPEN_LINE, LineHandler, Log, NinjaProgress, configure
from factory.process import run_command


@pytest.fixture
def handler() -> Iterator[LineHandler]:
    h = configure()
    yield h
    logging.getLogger(logger.ROOT).removeHandler(h)


def test_library_records_come_out_as_laid_out(handler: LineHandler,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    log = Log()
    log.step("source tree")
    log.detail("recipe fix applied")
    logging.getLogger("factory.process").info("raw line\n", extra=OPEN_LINE)
    err = capsys.readouterr().err
    assert re.fullmatch(r"\[ +\d+\.\ds\] source tree\n {11}recipe fix applied\nraw line\n", err)


def test_configure_replaces_the_handler_not_adds_one(handler: LineHandler) -> None:
    configure()
    configure()
    root = logging.getLogger(logger.ROOT)
    assert sum(isinstance(h, LineHandler) for h in root.handlers) == 1


def test_a_log_with_its_own_stream_writes_there_only(handler: LineHandler,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    mine = io.StringIO()
    Log(stream=mine).detail("only here")
    assert mine.getvalue() == "           only here\n"
    assert capsys.readouterr().err == ""


def test_echo_and_verbose_output_go_through_the_handler(
    handler: LineHandler, capsys: pytest.CaptureFixture[str]
) -> None:
    run_command([sys.executable, "-c", "print('from the child')"], echo=True, stream=True)
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("+ ") and err.endswith("from the child\n")


def test_progress_is_a_bar_on_a_terminal_and_deciles_in_ci(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    tty = Tty()
    with NinjaProgress(tmp_path / "none.log", Log(stream=tty), "ext") as bar:
        bar.update(1, 4)
        bar.update(4, 4)
    assert tty.getvalue().startswith("\r  ext [") and tty.getvalue().endswith("ETA     0s\n")
    assert tty.getvalue().count("\n") == 1  # one line, redrawn, closed at the end

    ci = io.StringIO()
    with NinjaProgress(tmp_path / "none.log", Log(stream=ci), "ext") as plain:
        plain.update(1, 4)
        plain.update(4, 4)
    assert [line.split(",")[0] for line in ci.getvalue().splitlines()] == [
        "           ext: 1/4 objects", "           ext: 4/4 objects"]


def test_the_cli_installs_the_handler(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger(logger.ROOT)
    for h in [h for h in root.handlers if isinstance(h, LineHandler)]:
        root.removeHandler(h)
    assert main([]) == 2  # no command: a usage error, after the handler is in place
    assert any(isinstance(h, LineHandler) for h in root.handlers)
