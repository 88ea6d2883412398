"""The command line as pip and cibuildwheel users expect it: global options anywhere, help for
every option, one metavar per kind of value, the exit codes in --help and the README, errors
as JSON under --json, shell completion, binary units, one-line refusals."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from factory.cli import build_parser, main
from factory.commands import matrix as matrix_command
from factory.commands._common import METAVAR_EXCEPTIONS, metavar_for, takes_value
from factory.errors import CellError, Interrupted, exit_codes

REPO = Path(__file__).resolve().parents[2]
MATRIX = str(REPO / "matrix.toml")
CELL = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
VOCABULARY = {"FILE", "DIR", "STORE", "NAME", "IMAGE", "SIZE", "N", "SECONDS", "VERSION",
              "ARCH", "CPU", "URL", "HOST", "PORT", "TEXT", "EXE", "DIR|URL", "CELL", "WHEEL",
              "SPEC", "FILENAME", "WHEEL|CELL", "CMD"}


def _actions() -> list[tuple[str, argparse.Action]]:
    out = []

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, command or name)
            elif not isinstance(action, argparse._HelpAction):
                out.append((command, action))

    walk(build_parser(), "")
    return out


def test_global_options_go_before_or_after_the_command(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["matrix", "-v", "--matrix", MATRIX]) == 0
    assert main(["-v", "matrix", "--matrix", MATRIX]) == 0
    assert main(["matrix", "--matrix", MATRIX, "--debug"]) == 0
    args = build_parser().parse_args(["-v", "plan", CELL])
    assert args.verbose is True and args.debug is False
    args = build_parser().parse_args(["plan", CELL, "--debug"])
    assert args.debug is True and args.verbose is False
    capsys.readouterr()
    # --debug after the command is --debug: the cell's own error, with its traceback, and the
    # class's exit code (not the interpreter's 1 of an uncaught exception)
    assert main(["plan", "--debug", "nosuch", "--matrix", MATRIX]) == CellError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "factory.errors.CellError: unparseable cell id 'nosuch'" in err
    assert err.splitlines()[-2].startswith("ERROR unparseable cell id 'nosuch'")
    # a usage error is no bug: one line, even with --debug
    assert main(["plan", "--debug", "--no-such-option", CELL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR factory: unrecognized arguments: --no-such-option")
    assert "Traceback" not in err


def test_every_option_has_help_and_a_metavar_of_its_kind() -> None:
    seen: dict[str, str] = {}
    for command, action in _actions():
        where = f"factory {command} {'/'.join(action.option_strings) or action.dest}"
        assert action.help, f"{where} has no help text"
        if not takes_value(action):
            continue
        assert action.metavar in VOCABULARY, f"{where}: metavar {action.metavar!r}"
        want = metavar_for(command, action)
        assert want is not None, f"{where}: not in commands/_common.py's METAVARS"
        assert action.metavar == want, f"{where}: {action.metavar} where its kind is {want}"
        if action.option_strings and (command, action.option_strings[-1]) not in \
                METAVAR_EXCEPTIONS:
            key = action.option_strings[-1]
            assert seen.setdefault(key, action.metavar) == action.metavar, where
    for command, action in _actions():  # a kind the table names, also where choices check it
        if action.choices is not None and action.option_strings and \
                metavar_for(command, action) is not None:
            assert action.metavar == metavar_for(command, action), (command, action.dest)
    for _, action in _actions():  # sizes are sizes everywhere
        if action.option_strings and action.option_strings[-1] in (
                "--memory", "--max-unpacked", "--max-upload"):
            assert action.metavar == "SIZE"


def test_the_exit_codes_are_in_help_and_in_the_readme(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    table = text[text.index("exit codes:"):]
    for code, what in exit_codes():
        assert re.search(rf"^\s+{code}\s+{re.escape(what)}$", table, re.M), (code, what)
    readme = (REPO / "README.md").read_text()
    for code, what in exit_codes():
        assert f"| {code} | {what} |" in readme, f"README's exit code table lacks {code}"
    assert (CellError.exit_code, "A cell id or spec that cannot be parsed or is not in the "
            "matrix") in exit_codes()


def test_errors_under_json_are_a_json_object_with_the_same_exit_code(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "nosuch-cell", "--matrix", MATRIX, "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert rc == doc["error"]["exit_code"] == CellError.exit_code
    assert doc["version"] == 1 and doc["error"]["type"] == "CellError"
    assert doc["error"]["message"].startswith("unparseable cell id 'nosuch-cell'")
    assert err.startswith("ERROR unparseable cell id")  # the line for people stays
    rc = main(["plan", CELL, "--json", "--memory", "lots", "--matrix", MATRIX])
    assert rc == 2 and json.loads(capsys.readouterr().out)["error"]["type"] == "UsageError"


@pytest.mark.parametrize(("raised", "code", "kind", "line"), [
    (RuntimeError("boom"), 70, "RuntimeError", "internal error: RuntimeError: boom (run with "
     "--debug for a traceback)"),
    (KeyboardInterrupt(), 130, "KeyboardInterrupt", "interrupted"),
    (Interrupted("signal 15"), 143, "Interrupted", "terminated (signal 15)"),
])
def test_a_bug_or_an_interrupt_under_json_is_the_same_json_error(
        raised: BaseException, code: int, kind: str, line: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def run(args: argparse.Namespace) -> int:
        raise raised

    monkeypatch.setattr(matrix_command, "run", run)
    assert main(["matrix", "--json"]) == code
    out, err = capsys.readouterr()
    assert json.loads(out) == {"version": 1, "error": {
        "exit_code": code, "type": kind, "message": line, "lines": [line], "tip": None}}
    assert err == f"ERROR {line}\n"
    # --debug: the traceback as well, the same exit code
    assert main(["matrix", "--debug"]) == code
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1].startswith(f"ERROR {line.split(' (run with')[0]}")


def test_bash_completes_commands_options_and_their_values(tmp_path: Path) -> None:
    script = tmp_path / "factory.bash"
    script.write_text(subprocess.run([sys.executable, "-m", "factory", "completion", "bash"],
                                     capture_output=True, text=True, check=True).stdout)
    probe = f"""source {script}
t() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); _factory
      echo "${{COMPREPLY[*]}}"; }}
t factory bu
t factory build --runner ""
t factory -v index ""
t factory doctor --format p
t factory build --mem
"""
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["build", "docker local cibuildwheel",
                                       out.stdout.splitlines()[2], "pip poetry pdm", "--memory"]
    assert out.stdout.splitlines()[2].startswith("rebuild verify wheel-variants")
    zsh = subprocess.run([sys.executable, "-m", "factory", "completion", "zsh"],
                         capture_output=True, text=True, check=True).stdout
    assert zsh.startswith("#compdef factory\n") and "bashcompinit" in zsh
    assert main(["completion", "fish"]) == 2


def test_the_dry_run_says_sizes_in_binary_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", CELL, "--dry-run", "--memory", "8g", "--matrix", MATRIX]) == 0
    out = capsys.readouterr().out
    plan = next(line for line in out.splitlines() if line.startswith("plan "))
    assert re.search(r"predicted peak \d+\.\d GiB of 8\.0 GiB\)$", plan), plan
    assert re.search(r"mem_limit = \d+ \(8\.0 GiB\)", out)


def test_a_missing_wheel_file_is_one_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope-1.0-py3-none-any.whl"
    assert main(["verify", str(missing)]) == 9
    assert capsys.readouterr().err == f"ERROR {missing}: no such file\n"
    assert main(["verify", str(tmp_path / "nope.whl")]) == 9
    assert "no such file" in capsys.readouterr().err
