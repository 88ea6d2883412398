"""The command line: a thin layer. Each subcommand lives in factory/commands/<name>.py with
``configure(parser)`` and ``run(args) -> int``; the table below names them. Errors are caught
here, once."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Protocol

from factory import __version__, actions, logger
from factory.commands import (
    build,
    cache,
    completion,
    doctor,
    facts,
    image,
    index,
    lock,
    matrix,
    plan,
    publish,
    rebuild_check,
    request,
    retain,
    schedule,
    serve,
    show,
    unyank,
    verify,
    wheelhouse,
    work,
    yank,
)
from factory.commands._common import apply_metavars
from factory.environment import DEBUG_ENV, ENVIRONMENT, VERBOSE_ENV, env_value
from factory.errors import FactoryError, Interrupted, UsageError, exit_codes, raise_interrupted


class Command(Protocol):
    """What a module in factory/commands/ provides."""

    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# name -> (the module that implements it, one-line help), in the order --help lists them.
COMMANDS: dict[str, tuple[Command, str]] = {
    "matrix": (matrix, "expand matrix.toml into cells"),
    "lock": (lock, "resolve matrix.toml's rules against the indexes into <matrix>.lock"),
    "facts": (facts, "what the indexes say about torch and the packages, and where it came "
              "from"),
    "plan": (plan, "choose MAX_JOBS / NVCC_THREADS for a cell under a memory and CPU budget"),
    "schedule": (schedule,
                 "the (missing) cells in groups: assigned to static builders, or one job per "
                 "group for Slurm or Kubernetes"),
    "build": (build, "build cells into verified, tagged wheels"),
    "work": (work, "work-queue mode: take the next unclaimed group that fits from the store, "
             "build and publish it, until nothing that fits is left"),
    "verify": (verify, "check wheels: archs in the binaries, tags, metadata, clean import"),
    "publish": (publish, "add wheels to the store and update the index pages"),
    "yank": (yank, "mark a published file as yanked (PEP 592)"),
    "unyank": (unyank, "undo a yank: the file is offered to resolvers again"),
    "index": (index, "rebuild or verify the index pages from the store"),
    "serve": (serve, "serve the index (embedded server)"),
    "request": (request, "one-off: find or build a wheel and print the install line"),
    "doctor": (doctor, "read this host and print the install line that fits it"),
    "show": (show, "print the provenance of a wheel or cell"),
    "image": (image, "make the builder base image (debootstrap + docker import), the glibc "
              "sysroot, or a CUDA 12.x builder image (NVIDIA's redist archives)"),
    "wheelhouse": (wheelhouse, "prepare the offline wheelhouse for a cell (torch and build deps)"),
    "retain": (retain, "keep the newest N builds per cell, yank older ones"),
    "cache": (cache, "the shared compile cache: stats, clear, pull and push (the remote one)"),
    "rebuild-check": (rebuild_check, "rebuild a published cell from source and compare it with "
                      "the published wheel"),
    "completion": (completion, "print the shell completion script: bash or zsh"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after its name (``factory -v build`` and
    ``factory build -v``). A subcommand's copy leaves the value alone unless given there."""
    default: object = False if top else argparse.SUPPRESS
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show a traceback when something fails (also FACTORY_DEBUG=1)")
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="stream the output of the commands the factory runs")


def exit_code_table() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {what}" for code, what in exit_codes())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="factory",
        description="Prebuilt CUDA wheels from a build matrix, served from a private index: "
        "matrix -> cell -> plan -> build -> wheel -> verify -> publish -> index.",
        epilog=exit_code_table() + "\n\n" + environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"factory {__version__}",
                        help="print the factory's version and exit")
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (command, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        command.configure(p)
        _global_options(p, top=False)
        for nested in _subparsers(p):
            _global_options(nested, top=False)
        p.set_defaults(_run=command.run, _root=parser)
    apply_metavars(parser)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """A command's own subcommands ('factory index rebuild', 'factory image base', ...)."""
    return [nested for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for nested in action.choices.values()]


def environment_help() -> str:
    """The FACTORY_* variables and the one precedence they share, for ``factory --help``."""
    width = max(len(v.name) for v in ENVIRONMENT)
    lines = ["environment (command line > environment > matrix.toml > default):"]
    lines += [f"  {v.name:<{width}}  {v.what}" for v in ENVIRONMENT]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """Escape what would break the one error line: argparse quotes user input raw, and a
    newline or carriage return in an argument would otherwise start a line of its own."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


@contextlib.contextmanager
def _verbose(on: bool) -> Iterator[None]:
    """-v for the command's length: factory.process streams by FACTORY_VERBOSE."""
    before = os.environ.get(VERBOSE_ENV)
    if on:
        os.environ[VERBOSE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VERBOSE_ENV, None)
        else:
            os.environ[VERBOSE_ENV] = before


def _failed(exc: BaseException, *, code: int, lines: Sequence[str], tip: str | None = None,
            argv: Sequence[str], wants_json: bool, traceback_too: bool,
            annotate: bool = True) -> int:
    """What every failure prints, then its exit code: with --debug the traceback first; under
    --json the error as a JSON object on stdout; one ``ERROR`` line each (and a ``TIP``) on
    stderr, naming the cell whose build failed outside a terminal; on GitHub Actions an error
    annotation."""
    if traceback_too:
        traceback.print_exception(exc, file=sys.stderr)
    if wants_json:
        message = exc.message if isinstance(exc, FactoryError) else lines[0]
        json.dump({"version": 1, "error": {
            "exit_code": code, "type": type(exc).__name__, "message": message,
            "lines": list(lines), "tip": tip}}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    cell = getattr(exc, "cell", None)
    for line in lines:
        print(logger.cell_line(f"ERROR {_one_line(line)}", cell, sys.stderr), file=sys.stderr)
    if tip:
        print(logger.cell_line(f"TIP {tip}", cell, sys.stderr), file=sys.stderr)
    if annotate and actions.on_actions():
        command = next((a for a in argv if a in COMMANDS), None)
        print(actions.error_annotation("\n".join(lines),
                                       title=f"factory {command}" if command else "factory"),
              file=sys.stderr)
    return code


def _sigterm_unwinds() -> None:
    """SIGTERM raises Interrupted, so a build stopped by its engine (Slurm, Kubernetes, a
    cancelled CI job) releases its lease and removes its cgroup or container on the way out:
    the next builder takes the cell at once instead of waiting for the lease to expire."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, raise_interrupted)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or env_value(DEBUG_ENV) == "1"
    wants_json = "--json" in argv  # also when the arguments themselves are what failed
    logger.configure()
    _sigterm_unwinds()
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "command", None):
            raise UsageError("no command given", tip="factory --help lists the commands")
        with _verbose(args.verbose):
            return int(args._run(args) or 0)
    except FactoryError as exc:
        # a usage error is no bug: one line even with --debug
        return _failed(exc, code=exc.exit_code, lines=exc.lines, tip=exc.tip, argv=argv,
                       wants_json=wants_json,
                       traceback_too=debug and not isinstance(exc, UsageError))
    except Interrupted as exc:
        return _failed(exc, code=Interrupted.exit_code, lines=[f"terminated ({exc})"],
                       argv=argv, wants_json=wants_json, traceback_too=debug, annotate=False)
    except KeyboardInterrupt as exc:
        return _failed(exc, code=130, lines=["interrupted"], argv=argv, wants_json=wants_json,
                       traceback_too=debug, annotate=False)
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: one line, and its traceback with --debug
        line = f"internal error: {type(exc).__name__}: {_one_line(str(exc))}"
        return _failed(exc, code=70,
                       lines=[line if debug else f"{line} (run with --debug for a traceback)"],
                       argv=argv, wants_json=wants_json, traceback_too=debug)
