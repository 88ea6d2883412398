"""Verify a wheel before it is published: archs in the binaries, tags, metadata, clean import.

Each check gives a ``Check`` (pass, fail or skipped, with a one-line detail); ``verify_wheel``
collects them into a ``WheelReport`` and raises VerifyError when one fails (unless told not to).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from factory.errors import EngineError, FactoryError, VerifyError, WheelError
from factory.matrix.load import PlannedCell
from factory.matrix.manylinux import manylinux_name
from factory.matrix.settings import default_settings
from factory.matrix.tags import local_tag, parse_local, platform_of_plat, torch_pin
from factory.process import last_error_line, run_program
from factory.recipes import default_archs_for as recipe_default_archs
from factory.toolchain.cross import (
    CPU_PLATFORMS,
    builder_platform,
    ensure_target_sysroot,
    find_qemu,
    pip_for_platform,
)
from factory.toolchain.wheelhouse import glibc_minor_of, platform_tags
from factory.wheels.floor import BinaryFloor, promised_glibc, wheel_floor
from factory.wheels.reader import WheelInfo, analyse_wheel

_CUBIN_RE = re.compile(r"\bsm_(\d+)([a-z]?)\.cubin\b")
_PTX_RE = re.compile(r"\b(?:sm|compute)_(\d+)([a-z]?)\.ptx\b")
_NO_DEVICE_CODE = "does not contain device code"
_MANYLINUX_RE = re.compile(r"manylinux(_\d+_\d+|1|2010|2014)_")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    # 'archs', 'filename', 'metadata', 'local-tag', 'torch-pin', 'platform', 'record', 'cpu',
    # 'glibc',
    # 'import'
    name: str
    ok: bool  # a skipped check is ok (it found nothing wrong) and says why it was skipped
    detail: str
    skipped: bool = False

    @property
    def status(self) -> str:
        return "skip" if self.skipped else ("pass" if self.ok else "fail")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "ok": self.ok, "detail": self.detail}


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelReport:
    wheel: str  # the filename
    checks: tuple[Check, ...]
    floor: BinaryFloor | None = None  # what the binaries need from the host's glibc

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def summary(self) -> str:
        bad = self.failures
        if not bad:
            return f"{self.wheel}: verified ({len(self.checks)} checks)"
        return f"{self.wheel}: {bad[0].name}: {bad[0].detail}" + (
            f" (and {len(bad) - 1} more failed check(s))" if len(bad) > 1 else ""
        )

    def as_dict(self) -> dict[str, Any]:
        return {"wheel": self.wheel, "ok": self.ok, "checks": [c.as_dict() for c in self.checks],
                "floor": self.floor.as_dict() if self.floor else None}


def check_floor(filename: str, floor: BinaryFloor) -> Check:
    """The platform tag promises a glibc; the binaries must need no newer one."""
    promised = promised_glibc(filename)
    if promised is None or floor.glibc is None:
        return Check(name="glibc", ok=True, skipped=promised is None,
                     detail=f"binaries: {floor.why()}"
                     + ("" if promised is not None else "; the tag promises no manylinux floor"))
    tag = manylinux_name(promised)
    if floor.glibc > promised:
        return Check(name="glibc", ok=False,
                     detail=f"the tag promises {tag} but the binaries need {floor.why()}")
    return Check(name="glibc", ok=True, detail=f"tag {tag}; binaries need {floor.why()}")


# -- cuobjdump ------------------------------------------------------------------------------------
def find_cuobjdump() -> Path:
    """cuobjdump from the nvidia-cuda-cuobjdump wheel (a dependency), else CUDA_HOME or PATH."""
    try:
        files = importlib.metadata.files("nvidia-cuda-cuobjdump") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "cuobjdump" and f.parent.name == "bin":
            path = Path(str(f.locate()))
            if path.is_file() and os.access(path, os.X_OK):
                return path
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "cuobjdump").is_file():
        return Path(cuda_home) / "bin" / "cuobjdump"
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    raise EngineError(
        "cuobjdump not found: cannot read the GPU archs in the wheel",
        tip="pip install nvidia-cuda-cuobjdump (a factory dependency), or put CUDA on PATH",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceCode:
    """The fatbin contents of one shared object, as cuobjdump lists them."""

    member: str  # path inside the wheel
    sass: tuple[str, ...]  # 'sm_100', 'sm_90a' (sorted, unique)
    ptx: tuple[str, ...]  # 'sm_90' for compute_90 PTX

    @property
    def sass_archs(self) -> frozenset[int]:
        return frozenset(int(re.sub(r"\D", "", s)) for s in self.sass)


def list_device_code(so_path: Path, member: str, *, cuobjdump: Path) -> DeviceCode:
    """SASS and PTX of one ELF file. A file without device code gives empty lists."""
    found: dict[str, tuple[str, ...]] = {}
    for flag, regex in (("--list-elf", _CUBIN_RE), ("--list-ptx", _PTX_RE)):
        proc = run_program(
            [cuobjdump, flag, so_path],
            error=VerifyError,
            what=f"cuobjdump {flag} {member}",
            check=False,
        )
        if proc.returncode != 0:
            if _NO_DEVICE_CODE in proc.stdout:
                found[flag] = ()
                continue
            line = proc.stdout.strip().splitlines()[-1:] or ["no output"]
            raise VerifyError(
                f"cuobjdump {flag} {member} failed (exit {proc.returncode}): {line[0][:300]}"
            )
        found[flag] = tuple(
            sorted({f"sm_{m.group(1)}{m.group(2)}" for m in regex.finditer(proc.stdout)})
        )
    return DeviceCode(member=member, sass=found["--list-elf"], ptx=found["--list-ptx"])


def _device_code(info: WheelInfo, *, cuobjdump: Path) -> list[DeviceCode]:
    out = []
    with (
        zipfile.ZipFile(info.path) as zf,
        tempfile.TemporaryDirectory(prefix="factory-cuobjdump-") as tmp,
    ):
        for i, member in enumerate(info.extensions):
            with zf.open(member) as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
            target = Path(tmp) / f"{i}-{Path(member).name}"
            with zf.open(member) as fin, target.open("wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            out.append(list_device_code(target, member, cuobjdump=cuobjdump))
            target.unlink()
    return out


def check_archs(
    info: WheelInfo,
    want: Iterable[int] | None,
    *,
    allow_ptx: bool = False,
    cuobjdump: Path | None = None,
) -> Check:
    if want is None:
        return Check(
            name="archs",
            ok=False,
            detail="the requested arch set is unknown: the tag has no sm "
            "marker and no recipe default arch set is known for this package",
        )
    want_set = frozenset(want)
    codes = _device_code(info, cuobjdump=cuobjdump or find_cuobjdump())
    with_code = [c for c in codes if c.sass or c.ptx]
    wanted = ", ".join(f"sm_{a}" for a in sorted(want_set))
    if not with_code:
        return Check(
            name="archs",
            ok=False,
            detail=f"no GPU code in any of {len(codes)} ELF file(s); wanted {wanted}",
        )
    problems = []
    for c in with_code:
        if c.sass_archs != want_set:
            problems.append(f"{c.member} has SASS {', '.join(c.sass) or 'none'}, wanted {wanted}")
        if c.ptx and not allow_ptx:
            problems.append(
                f"{c.member} carries PTX {', '.join(c.ptx)} (JIT code nobody asked for)"
            )
    if problems:
        return Check(name="archs", ok=False, detail="; ".join(problems))
    ptx = sorted({p for c in with_code for p in c.ptx})
    return Check(
        name="archs",
        ok=True,
        detail=f"SASS {wanted} in {len(with_code)} file(s)"
        + (f", PTX {', '.join(ptx)}" if ptx else ", no PTX"),
    )


# -- the CPU of every ELF file ---------------------------------------------------------------------
def elf_machine(header: bytes) -> int | None:
    """e_machine of an ELF header (its first 20 bytes), None when it is not ELF."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    order = "little" if header[5] == 1 else "big"
    return int.from_bytes(header[18:20], order)


def tag_cpus(info: WheelInfo) -> set[str]:
    """The CPUs the wheel's platform tags name ('aarch64'); WheelError for a tag naming none."""
    return {platform_of_plat(p) for p in info.platforms}


def check_cpu(info: WheelInfo) -> Check:
    """Every ELF file in the wheel is for the CPU its platform tag names (a cross build that
    fell back to the builder's own compiler produces x86-64 objects in an aarch64 wheel)."""
    try:
        cpus = tag_cpus(info)
    except WheelError as exc:
        return Check(name="cpu", ok=False, detail=exc.message)
    if len(cpus) != 1 or not cpus <= set(CPU_PLATFORMS):
        return Check(name="cpu", ok=False, detail=f"platform tags name CPUs {sorted(cpus)}")
    cpu = CPU_PLATFORMS[cpus.pop()]
    by_machine = {p.elf_machine: p.elf_name for p in CPU_PLATFORMS.values()}
    wrong, count = [], 0
    with zipfile.ZipFile(info.path) as zf:
        for member in zf.namelist():
            with zf.open(member) as fh:
                machine = elf_machine(fh.read(20))
            if machine is None:
                continue
            count += 1
            if machine != cpu.elf_machine:
                wrong.append(f"{member} is {by_machine.get(machine, f'machine {machine}')}")
    if not count:
        return Check(name="cpu", ok=False, detail="no ELF file in the wheel")
    if wrong:
        return Check(name="cpu", ok=False,
                     detail=f"wanted {cpu.elf_name}: " + "; ".join(wrong[:3])
                     + (f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""))
    return Check(name="cpu", ok=True, detail=f"{count} ELF file(s), all {cpu.elf_name}")


# -- tags and metadata ----------------------------------------------------------------------------


def _metadata_checks(
    info: WheelInfo, expected: PlannedCell | None, default_archs: tuple[int, ...] | None
) -> tuple[list[Check], tuple[int, ...] | None]:
    """Checks from filename, WHEEL, METADATA and RECORD; also returns the arch set the wheel
    should carry (from the tag, else the default set), None when it cannot be known."""
    local, tag_minor, want_archs = _local_tag_check(info, expected, default_archs)
    checks = [
        _filename_check(info, expected),
        _metadata_check(info),
        local,
        _torch_pin_check(info, tag_minor),
        _platform_check(info),
        _record_check(info),
    ]
    return checks, want_archs


def _filename_check(info: WheelInfo, expected: PlannedCell | None) -> Check:
    if expected is None:
        return Check(name="filename", ok=True, detail="parses")
    same = info.filename == expected.wheel
    return Check(
        name="filename",
        ok=same,
        detail="as planned" if same else f"{info.filename} is not the planned {expected.wheel}",
    )


def _metadata_check(info: WheelInfo) -> Check:
    """Name, Version and tags agree between the filename, METADATA and WHEEL."""
    problems = []
    if canonicalize_name(info.name) != info.filename_name:
        problems.append(
            f"METADATA Name {info.name!r} differs from the filename's {info.filename_name!r}"
        )
    if info.version != info.filename_version:
        problems.append(
            f"METADATA Version {info.version} differs from the filename's {info.filename_version}"
        )
    if set(info.wheel_tags) != set(info.tags):
        problems.append(f"WHEEL tags {', '.join(info.wheel_tags)} differ from the filename's")
    if info.requires_python is not None:
        try:
            SpecifierSet(info.requires_python)
        except Exception:
            problems.append(f"Requires-Python {info.requires_python!r} does not parse")
    return Check(
        name="metadata",
        ok=not problems,
        detail="; ".join(problems)
        or f"Name, Version, WHEEL tags agree (Metadata-Version {info.metadata_version})",
    )


def _local_tag_check(
    info: WheelInfo, expected: PlannedCell | None, default_archs: tuple[int, ...] | None
) -> tuple[Check, str | None, tuple[int, ...] | None]:
    """The local version tag against the plan; also the torch minor it names (None without a
    valid tag) and the arch set the wheel should carry (the tag's, else the default set)."""
    if info.local is None:
        return (
            Check(name="local-tag", ok=False, detail=f"version {info.version} has no local tag"),
            None,
            default_archs,
        )
    try:
        lt = parse_local(info.local)
    except WheelError as exc:
        return Check(name="local-tag", ok=False, detail=exc.message), None, default_archs
    want_archs = lt.archs if lt.archs is not None else default_archs
    problems = []
    if expected is not None:
        cell = expected.cell
        planned = local_tag(
            cuda=cell.cuda,
            torch_minor=cell.torch_minor,
            archs=cell.archs,
            default_archs=expected.recipe.default_archs,
        )
        if info.local != planned:
            problems.append(f"+{info.local} is not the planned +{planned}")
        if lt.cuda != cell.cuda or lt.torch_minor != cell.torch_minor:
            problems.append(
                f"tag says CUDA {lt.cuda} / torch {lt.torch_minor}, cell says "
                f"CUDA {cell.cuda} / torch {cell.torch_minor}"
            )
        if want_archs is not None and tuple(sorted(want_archs)) != cell.archs:
            problems.append(f"tag arch set {want_archs} is not the cell's {cell.archs}")
    check = Check(
        name="local-tag",
        ok=not problems,
        detail="; ".join(problems)
        or (
            f"+{info.local}: CUDA {lt.cuda}, torch {lt.torch_minor}, archs "
            + (", ".join(f"sm_{a}" for a in want_archs) if want_archs else "unknown")
        ),
    )
    return check, lt.torch_minor, want_archs


def _torch_pin_check(info: WheelInfo, tag_minor: str | None) -> Check:
    """Exactly one torch requirement, pinned to the tag's torch minor."""
    if tag_minor is None:
        return Check(
            name="torch-pin", ok=False, detail="no torch minor to pin against (no valid tag)"
        )
    torch_reqs = [str(r) for r in info.torch_requirements()]
    pin = torch_pin(tag_minor)
    ok = torch_reqs == [pin]
    return Check(
        name="torch-pin",
        ok=ok,
        detail=f"Requires-Dist: {pin}"
        if ok
        else (
            f"wanted exactly Requires-Dist: {pin}, found "
            f"{'; '.join(torch_reqs) or 'no torch requirement'}"
        ),
    )


def _platform_check(info: WheelInfo) -> Check:
    bad_plats = [p for p in info.platforms if not _MANYLINUX_RE.match(p)]
    return Check(
        name="platform",
        ok=not bad_plats,
        detail=f"not manylinux: {', '.join(bad_plats)}" if bad_plats else ", ".join(info.platforms),
    )


def _record_check(info: WheelInfo) -> Check:
    if info.record_ok:
        return Check(name="record", ok=True, detail="every file hashed and listed")
    more = len(info.record_problems) - 1
    return Check(
        name="record",
        ok=False,
        detail=info.record_problems[0] + (f" (+{more} more)" if more else ""),
    )


# -- clean import ---------------------------------------------------------------------------------
def _python_for(info: WheelInfo) -> tuple[str | None, str]:
    """(interpreter, why): the host's when its version matches the wheel's cp tag, else a
    python3.X on PATH, else None with the reason."""
    cps = [i for i in info.interpreters if re.fullmatch(r"cp3\d+", i)]
    if not cps:
        return None, f"no CPython tag in {', '.join(info.interpreters)}"
    host = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if host in cps:
        return sys.executable, host
    for cp in cps:
        found = shutil.which(f"python3.{cp[3:]}")
        if found:
            return found, cp
    return (
        None,
        f"the wheel is for {', '.join(cps)}, this host runs {host} and has no python3.{cps[0][3:]}",
    )


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


def _modules(info: WheelInfo) -> list[str]:
    modules = list(info.top_level)
    # torch first, as every user does: extensions rely on it having loaded libtorch.
    if modules and info.torch_requirements() and "torch" not in modules:
        modules.insert(0, "torch")
    return modules


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
) -> Check:
    """Install into a clean environment, offline, and import. A wheel for another CPU than this
    host's is installed for its platform (host pip, ``--target``) and imported by the target's
    Python under qemu-user (``sysroots``: where the target root filesystems are kept)."""
    try:
        cpus = tag_cpus(info)
    except WheelError:
        cpus = set()
    if len(cpus) == 1 and cpus != {builder_platform()}:
        return check_import_emulated(
            info, target=cpus.pop(), wheelhouse=wheelhouse, echo=echo, log_path=log_path,
            sysroots=sysroots,
        )
    python, why = _python_for(info)
    if python is None:
        return Check(name="import", ok=True, skipped=True, detail=f"skipped: {why}")
    modules = _modules(info)
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
        argv.append(info.path.resolve())
        proc = run_program(
            argv,
            error=VerifyError,
            what="pip install",
            env=_clean_env(),
            echo=echo,
            log_path=log_path,
            check=False,
            timeout=1800,
        )
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
    modules = _modules(info)
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
        argv.append(info.path.resolve())
        proc = run_program(argv, error=VerifyError, what=f"pip install --target ({target})",
                           env=_clean_env(), echo=echo, log_path=log_path, check=False,
                           timeout=1800)
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


# -- the whole verification -----------------------------------------------------------------------
def verify_wheel(
    path: Path,
    *,
    expected: PlannedCell | None = None,
    import_check: bool = True,
    wheelhouse: Path | None = None,
    raise_on_failure: bool = True,
    default_archs: tuple[int, ...] | None = None,
    allow_ptx: bool = False,
    echo: Callable[[str], None] | None = None,
    log_path: Path | None = None,
    sysroots: Path | None = None,
) -> WheelReport:
    """Run every check on ``path``. With ``expected`` the wheel must be exactly that cell's.

    The wanted arch set is the one in the local tag; a tag without sm marker means the recipe's
    default set (``expected.recipe``, else ``default_archs``, else the recipe named like the
    package). Raises VerifyError with the first failure unless ``raise_on_failure`` is False.
    Raises EngineError when cuobjdump is missing (not the wheel's fault).
    """
    path = Path(path)
    try:
        info = analyse_wheel(path)
    except WheelError as exc:
        report = WheelReport(
            wheel=path.name, checks=(Check(name="wheel", ok=False, detail=exc.message),)
        )
        if raise_on_failure:
            raise VerifyError(report.summary()) from None
        return report
    if expected is not None:
        defaults = expected.recipe.default_archs
    else:
        defaults = default_archs if default_archs is not None else recipe_default_archs(info.name)
    checks, want_archs = _metadata_checks(info, expected, defaults)
    if expected is not None:
        want_archs = expected.cell.archs  # the plan decides, whatever the tag claims
    checks.append(check_cpu(info))
    checks.append(check_archs(info, want_archs, allow_ptx=allow_ptx))
    try:
        floor: BinaryFloor | None = wheel_floor(path)
    except WheelError as exc:
        floor = None
        checks.append(Check(name="glibc", ok=False, detail=exc.message))
    if floor is not None:
        checks.append(check_floor(info.filename, floor))
    if import_check:
        try:
            checks.append(check_import(info, wheelhouse=wheelhouse, echo=echo, log_path=log_path,
                                       sysroots=sysroots))
        except FactoryError as exc:  # venv creation, timeouts: the check failed, say why
            checks.append(Check(name="import", ok=False, detail=exc.message))
    else:
        checks.append(Check(name="import", ok=True, skipped=True, detail="skipped: not asked for"))
    report = WheelReport(wheel=info.filename, checks=tuple(checks), floor=floor)
    if raise_on_failure and not report.ok:
        raise VerifyError(report.summary())
    return report
