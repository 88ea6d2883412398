"""Verify a wheel before it is published: archs in the binaries, tags, metadata, clean import.

Each check gives a ``Check`` (pass, fail or skipped, with a one-line detail; ``report.py``);
``verify_wheel`` collects them into a ``WheelReport`` and raises VerifyError when one fails
(unless told not to). What the binaries hold is read in ``binaries.py``, the clean import is
``import_check.py``; the tag and metadata checks are here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from factory.errors import FactoryError, VerifyError, WheelError
from factory.matrix.cell import sm_names
from factory.matrix.load import PlannedCell
from factory.matrix.tags import parse_local, torch_pin
from factory.recipes import default_archs_for as recipe_default_archs
from factory.recipes import recipe_for_project
from factory.wheels.binaries import check_archs, check_cpu, check_floor
from factory.wheels.floor import BinaryFloor, wheel_floor
from factory.wheels.import_check import check_import
from factory.wheels.reader import WheelInfo, analyse_wheel
from factory.wheels.report import Check, WheelReport

_MANYLINUX_RE = re.compile(r"manylinux(_\d+_\d+|1|2010|2014)_")


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
        planned = expected.local
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
            + (sm_names(want_archs) if want_archs else "unknown")
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
    recipe = expected.recipe if expected is not None else recipe_for_project(info.name)
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
                                       sysroots=sysroots, smoke=recipe.smoke if recipe else None))
        except FactoryError as exc:  # venv creation, timeouts: the check failed, say why
            checks.append(Check(name="import", ok=False, detail=exc.message))
    else:
        checks.append(Check(name="import", ok=True, skipped=True, detail="skipped: not asked for"))
    report = WheelReport(wheel=info.filename, checks=tuple(checks), floor=floor)
    if raise_on_failure and not report.ok:
        raise VerifyError(report.summary())
    return report
