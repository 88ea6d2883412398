"""The clean import: a wheel installed offline into a clean environment (only the wheelhouse,
none of the host's pip or Python settings) and imported, torch first, with no GPU visible; a
wheel for another CPU is installed for its platform and imported by the target's Python under
qemu-user."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from factory.errors import VerifyError, WheelError
from factory.matrix.settings import default_settings
from factory.process import last_error_line, run_program
from factory.recipes.base import SmokeTest
from factory.toolchain.cross import (
    builder_platform,
    ensure_target_sysroot,
    find_qemu,
    pip_for_platform,
)
from factory.toolchain.wheelhouse import glibc_minor_of, platform_tags
from factory.wheels.binaries import tag_cpus
from factory.wheels.reader import WheelInfo
from factory.wheels.report import Check


def _python_for(info: WheelInfo) -> tuple[str | None, str]:
    """(interpreter, why): the host's when its version matches the wheel's cp tag, else a
    python3.X on PATH that runs as that version (a pyenv shim for a version that is not
    selected is on PATH and exits 127), else None with the reason."""
    cps = [i for i in info.interpreters if re.fullmatch(r"cp3\d+", i)]
    if not cps:
        return None, f"no CPython tag in {', '.join(info.interpreters)}"
    host = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if host in cps:
        return sys.executable, host
    broken = []
    for cp in cps:
        found = shutil.which(f"python3.{cp[3:]}")
        if found and _runs_as(found, cp):
            return found, cp
        if found:
            broken.append(found)
    if broken:
        return None, (f"the wheel is for {', '.join(cps)}, and {', '.join(broken)} on PATH does "
                      "not run as that version")
    return (
        None,
        f"the wheel is for {', '.join(cps)}, this host runs {host} and has no python3.{cps[0][3:]}",
    )


def _runs_as(python: str, cp: str) -> bool:
    """Whether ``python`` starts and is CPython version ``cp`` ('cp313')."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60, env=_clean_env(), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == cp


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The host's environment without pip and Python settings: a clean install must see only
    the wheelhouse, not a host's find-links, extra indexes or constraints."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV", "UV_"))
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra or {})
    return env


def _modules(info: WheelInfo, smoke: SmokeTest | None = None) -> list[str]:
    """What the smoke test imports: the recipe's modules, else every top-level module."""
    modules = list(smoke.imports if smoke and smoke.imports else info.top_level)
    # torch first, as every user does: extensions rely on it having loaded libtorch.
    if modules and info.torch_requirements() and "torch" not in modules:
        modules.insert(0, "torch")
    return modules


def _installs(info: WheelInfo, smoke: SmokeTest | None) -> list[list[str | Path]]:
    """The pip install arguments, one list per pip call: the wheel with its dependencies, or
    (``with-dependencies = false``) its torch pin first, then the wheel alone."""
    wheel = info.path.resolve()
    if smoke is None or smoke.with_dependencies:
        return [[wheel]]
    pins: list[str | Path] = [str(r) for r in info.torch_requirements()]
    return [pins, ["--no-deps", wheel]] if pins else [["--no-deps", wheel]]


def _import_code(modules: list[str]) -> str:
    code = "; ".join(f"import {m}" for m in modules)
    if "torch" in modules:
        code += "; print('torch', torch.__version__)"
    return code


def check_import(
    info: WheelInfo,
    *,
    wheelhouse: Path | None,
    echo: Callable[[str], None] | None = None,
    log_path: Path | None = None,
    sysroots: Path | None = None,
    smoke: SmokeTest | None = None,
) -> Check:
    """Install into a clean environment, offline, and import. A wheel for another CPU than this
    host's is installed for its platform (host pip, ``--target``) and imported by the target's
    Python under qemu-user (``sysroots``: where the target root filesystems are kept).
    ``smoke`` (the recipe's): which modules, and whether the wheel's other runtime dependencies
    are installed first (else the wheel and its torch pin only)."""
    try:
        cpus = tag_cpus(info)
    except WheelError:
        cpus = set()
    if len(cpus) == 1 and cpus != {builder_platform()}:
        return check_import_emulated(
            info, target=cpus.pop(), wheelhouse=wheelhouse, echo=echo, log_path=log_path,
            sysroots=sysroots, smoke=smoke,
        )
    python, why = _python_for(info)
    if python is None:
        return Check(name="import", ok=True, skipped=True, detail=f"skipped: {why}")
    modules = _modules(info, smoke)
    if not modules:
        return Check(name="import", ok=False, detail="the wheel has no importable top-level module")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="factory-verify-") as tmp:
        venv = Path(tmp) / "venv"
        run_program(
            [python, "-m", "venv", venv],
            error=VerifyError,
            what="creating a clean venv",
            env=_clean_env(),
            echo=echo,
            log_path=log_path,
        )
        vpy = venv / "bin" / "python"
        argv: list[str | Path] = [
            vpy,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-compile",
            "--quiet",
        ]
        if wheelhouse is not None:
            argv += ["--find-links", wheelhouse]
        for install in _installs(info, smoke):
            proc = run_program(
                [*argv, *install],
                error=VerifyError,
                what="pip install",
                env=_clean_env(),
                echo=echo,
                log_path=log_path,
                check=False,
                timeout=1800,
            )
            if proc.returncode != 0:
                break
        if proc.returncode != 0:
            return Check(
                name="import",
                ok=False,
                detail=f"pip install --no-index failed: "
                f"{last_error_line(proc.stdout)}"
                + ("" if wheelhouse else " (no wheelhouse given)"),
            )
        code = _import_code(modules)
        # -I: nothing from the cwd or PYTHON* variables; no GPU visible, as on a build host.
        proc = run_program(
            [vpy, "-I", "-c", code],
            error=VerifyError,
            what="import check",
            env=_clean_env({"CUDA_VISIBLE_DEVICES": ""}),
            cwd=Path(tmp),
            echo=echo,
            log_path=log_path,
            check=False,
            timeout=600,
        )
        if proc.returncode != 0:
            return Check(
                name="import", ok=False, detail=f"{code!r} failed: {last_error_line(proc.stdout)}"
            )
    torch_line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("torch ")), "")
    return Check(
        name="import",
        ok=True,
        detail=(
            f"installed into a clean venv ({why}) and imported {', '.join(modules)}"
            + (f" with {torch_line}" if torch_line else "")
            + f" in {time.monotonic() - t0:.0f}s"
        ),
    )


def check_import_emulated(
    info: WheelInfo,
    *,
    target: str,
    wheelhouse: Path | None,
    echo: Callable[[str], None] | None = None,
    log_path: Path | None = None,
    sysroots: Path | None = None,
    smoke: SmokeTest | None = None,
) -> Check:
    """The import check of a wheel for another CPU: host pip installs it and its deps from the
    (target's) wheelhouse for the target's platform tags into a clean directory, then the
    target's Python imports it under qemu-user. No GPU and no target machine needed."""
    cps = [i for i in info.interpreters if re.fullmatch(r"cp3\d+", i)]
    if not cps:
        return Check(name="import", ok=False,
                     detail=f"no CPython tag in {', '.join(info.interpreters)}")
    python = f"3.{cps[0][3:]}"
    qemu = find_qemu(target)
    if qemu is None:
        return Check(name="import", ok=False,
                     detail=f"qemu-{target} not found: the {target} import check runs under "
                     "qemu-user (apt-get install qemu-user-static)")
    modules = _modules(info, smoke)
    if not modules:
        return Check(name="import", ok=False, detail="the wheel has no importable top-level module")
    sysroot = ensure_target_sysroot(sysroots or default_settings().sysroots_dir, target=target,
                                    python=python)
    t0 = time.monotonic()
    plats = platform_tags(glibc_minor_of(info.platforms[0]), target)
    with tempfile.TemporaryDirectory(prefix="factory-verify-") as tmp:
        site = Path(tmp) / "site"
        argv: list[str | Path] = [
            sys.executable, "-m", "pip", "install", "--no-index", "--no-compile", "--quiet",
            "--target", site, *pip_for_platform(python, plats),
        ]
        if wheelhouse is not None:
            argv += ["--find-links", wheelhouse]
        for install in _installs(info, smoke):
            proc = run_program([*argv, *install], error=VerifyError,
                               what=f"pip install --target ({target})", env=_clean_env(),
                               echo=echo, log_path=log_path, check=False, timeout=1800)
            if proc.returncode != 0:
                break
        if proc.returncode != 0:
            return Check(name="import", ok=False,
                         detail=f"pip install --no-index for {target} failed: "
                         f"{last_error_line(proc.stdout)}"
                         + ("" if wheelhouse else " (no wheelhouse given)"))
        code = f"import sys; sys.path.insert(0, {str(site)!r}); " + _import_code(modules)
        proc = run_program(
            [qemu, "-L", sysroot, sysroot / "usr" / "bin" / f"python{python}", "-I", "-c", code],
            error=VerifyError, what=f"import check under {Path(qemu).name}",
            # children of the emulated process find their libraries in the sysroot too
            env=_clean_env({"CUDA_VISIBLE_DEVICES": "", "QEMU_LD_PREFIX": str(sysroot)}),
            cwd=Path(tmp), echo=echo, log_path=log_path, check=False, timeout=1200,
        )
        if proc.returncode != 0:
            return Check(name="import", ok=False,
                         detail=f"{_import_code(modules)!r} under {Path(qemu).name} failed: "
                         f"{last_error_line(proc.stdout)}")
    torch_line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("torch ")), "")
    return Check(
        name="import",
        ok=True,
        detail=f"installed for {target} (pip --target) and imported {', '.join(modules)} by "
        f"{target} Python {python} under {Path(qemu).name}"
        + (f" with {torch_line}" if torch_line else "") + f" in {time.monotonic() - t0:.0f}s",
    )
