"""The build's interpreter: a venv (shared by builds with the same requirements, reused by
retries) or the given Python as it is, and the requirements installed offline."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .log import Log
from .steps import clean_env, run_step


@contextlib.contextmanager
def venv_lock(venv: str | None) -> Iterator[None]:
    """Builds that share a venv (two cells of one Python, a retry racing a stale run) must not
    create it or pip-install into it at the same time."""
    if not venv:
        yield
        return
    Path(venv).mkdir(parents=True, exist_ok=True)
    with open(Path(venv) / ".factory-lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare_interpreter(
    job: dict[str, Any], log: Log, report: dict[str, Any]
) -> tuple[int, str, list[str]]:
    """A venv (reused across retries) or the given interpreter as it is; then the requirements,
    offline, skipped when a stamp says this set is installed (a retry saves the 40 s install).
    Returns (exit code, python, PATH entries to put first)."""
    python = job["python"]
    venv = job.get("venv")
    path_prefix: list[str] = []
    if venv:
        vpy = Path(venv) / "bin" / "python"
        if not vpy.exists():
            report["phase"] = "venv"
            args = [python, "-m", "venv"]
            if job.get("system_site_packages"):
                args.append("--system-site-packages")
            code = run_step([*args, venv], env=clean_env({}), cwd=None, log=log)
            if code != 0:
                return code, python, path_prefix
        python = str(vpy)
        path_prefix.append(str(Path(venv) / "bin"))
    reqs = list(job.get("requirements", []))
    stamp = (Path(venv) if venv else Path(job["run_dir"])) / ".factory-requirements"
    key = hashlib.sha256(json.dumps(sorted(reqs)).encode()).hexdigest()
    if reqs and (not stamp.exists() or stamp.read_text().strip() != key):
        report["phase"] = "install"
        t0 = time.monotonic()
        code = run_step(
            [
                python,
                "-m",
                "pip",
                "install",
                "--no-index",
                "--find-links",
                job["wheelhouse"],
                *reqs,
            ],
            env=clean_env({}),
            cwd=None,
            log=log,
        )
        report["install_seconds"] = round(time.monotonic() - t0, 1)
        if code != 0:
            return code, python, path_prefix
        stamp.write_text(key + "\n")
    return 0, python, path_prefix
