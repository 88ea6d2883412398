"""Running one step (a subprocess in its own process group, its output to the log), stopping
the running step, and the clean environment every step gets."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from .log import Log

_current: subprocess.Popen[bytes] | None = None
stopping = threading.Event()


def kill_current() -> None:
    proc = _current
    if proc is None or proc.poll() is not None:
        return
    # Each step runs in its own process group: ninja, nvcc, cicc, ptxas all go together.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    log: Log,
    on_start: Any = None,
    on_line: Any = None,
) -> int:
    global _current
    if stopping.is_set():
        return 143
    log.line("+ " + shlex.join(argv))
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    _current = proc
    if on_start:
        on_start(proc.pid)
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        log.write(raw)
        if on_line:
            on_line(raw.decode(errors="replace"))
    code = proc.wait()
    _current = None
    return code


def watch_stdin(log: Log) -> None:
    try:
        # os.read, not sys.stdin: a daemon thread blocked in a buffered read aborts the
        # interpreter at exit.
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    if not stopping.is_set():
        log.line("factory: the runner went away (stdin closed): stopping the build")
        terminate()


def terminate(*_: object) -> None:
    stopping.set()
    kill_current()


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    # The host's pip configuration (find-links, extra indexes, constraints) must not leak into
    # an offline build: only the wheelhouse counts.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        {
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
            "PIP_NO_CACHE_DIR": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env



def install_script(spec: dict[str, str]) -> str:
    """Write an executable script (``{"path", "text"}``); returns its path."""
    Path(spec["path"]).write_text(spec["text"])
    os.chmod(spec["path"], 0o755)
    return spec["path"]


def which(name: str, path: str) -> str | None:
    for d in path.split(os.pathsep):
        cand = Path(d) / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None

