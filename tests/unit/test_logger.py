"""The one output handler: library modules log through `logging`, the CLI's handler writes the
lines as laid out (steps, details, echoed commands, raw subprocess output, the progress bar)."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from factory import logger
from factory.cli import main
from factory.logger import OPEN_LINE, LineHandler, Log, Ticker, configure
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


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_ticker_redraws_one_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    tty = Tty()
    said = iter(["first", "second, longer"])
    with Ticker(Log(stream=tty), lambda: next(said, "last")):
        pass
    text = tty.getvalue()
    assert text.startswith("\r") and text.endswith("\n") and text.count("\n") == 1
    assert text.rstrip("\n").split("\r")[-1].strip() in ("first", "second, longer", "last")


def test_a_ticker_writes_a_line_at_most_every_30_s_outside_a_terminal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(logger.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    ticker = Ticker(Log(stream=out), lambda: f"at {clock[0]:.0f}")
    for _ in range(3):  # shown, then 10 s and 29 s later: not yet
        ticker._show(False)
        clock[0] += 10 if clock[0] < 1010 else 19
    clock[0] = 1031
    ticker._show(False)  # 31 s after the first line
    ticker._show(True)  # the last one, whatever the time
    lines = [ln.strip() for ln in out.getvalue().splitlines()]
    assert lines == ["at 1000", "at 1031"]  # the final one repeats nothing
    clock[0] = 1040
    ticker._show(True)
    assert out.getvalue().splitlines()[-1].strip() == "at 1040"


def test_lines_name_the_cell_outside_a_terminal(handler: LineHandler,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with logger.cell_lines("flash-attn@cu130-torch2.14-sm100-cp311", "the-full-id"):
        Log().step("source tree")
        logging.getLogger("factory.process").info("raw one\nraw two\n", extra=OPEN_LINE)
    Log().detail("after")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[flash-attn@cu130-torch2.14-sm100-cp311] [")
    assert err[1:3] == ["[flash-attn@cu130-torch2.14-sm100-cp311] raw one",
                        "[flash-attn@cu130-torch2.14-sm100-cp311] raw two"]
    assert err[3] == "           after"


def test_on_actions_a_cell_is_a_fold_group_and_a_failure_an_annotation(
        handler: LineHandler, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    with logger.cell_lines("ext@cu130", "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"):
        Log().error("FAILED: build failed (exit 1)\nsecond line", title="ext@cu130")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "::group::factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
    assert err[1].startswith("[ext@cu130] [") and err[1].endswith("FAILED: build failed (exit 1)")
    assert err[3] == "::error title=ext@cu130::FAILED: build failed (exit 1)%0Asecond line"
    assert err[-1] == "::endgroup::"
    monkeypatch.setenv("FACTORY_CI_GROUPS", "0")  # builds side by side: no groups, prefixes
    with logger.cell_lines("ext@cu130", "x"):
        Log().detail("a")
    assert capsys.readouterr().err == "[ext@cu130]            a\n"


def test_the_cli_installs_the_handler(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger(logger.ROOT)
    for h in [h for h in root.handlers if isinstance(h, LineHandler)]:
        root.removeHandler(h)
    assert main([]) == 2  # no command: a usage error, after the handler is in place
    assert any(isinstance(h, LineHandler) for h in root.handlers)
