"""A ``[packages.NAME]`` table, parsed: its recipe, source, versions (as written, and as the
rules resolved them) and its own axes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from factory.errors import CellError, ConfigError
from factory.matrix.cell import DEFAULT_PLATFORM, parse_arch, parse_platform
from factory.matrix.rules import (
    Rule,
    cuda_rule,
    python_range,
    python_rule,
    torch_rule,
    version_rule,
)
from factory.matrix.settings import check_keys, check_manylinux
from factory.recipes import Recipe, get_recipe
from factory.upstream.facts import Facts


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackageSpec:
    name: str
    recipe: Recipe
    versions: tuple[str, ...]  # resolved: exact versions, and what the rules gave
    source: str  # "pypi" or a path (relative to the matrix file's directory)
    sha256: str | None
    axes: dict[str, list[Any]]
    manylinux: str | None = None  # the package's glibc floor, over [settings] manylinux
    version_rules: tuple[Rule, ...] = ()  # versions = [...] as written
    python_range: SpecifierSet | None = None  # what python = ["torch"] may give

    def sha256_of(self, version: str, facts: Facts | None) -> tuple[str | None, str | None]:
        """(sdist filename, sha256) of ``version``: the matrix's pin for its one exact
        version, else what the facts list (None where they do not know the release)."""
        release = (facts.packages.get(self.name, {}).get(version)
                   if facts is not None and self.source == "pypi" else None)
        one_exact = (len(self.version_rules) == 1 and not self.version_rules[0].tracking
                     and self.versions == (version,))
        pinned = self.sha256 if one_exact else None
        if pinned and release and release.sha256 and release.sha256 != pinned.lower():
            raise ConfigError(
                f"[packages.{self.name}] sha256 {pinned} is not the sha256 PyPI lists for "
                f"{release.sdist} ({release.sha256}; {release.origin.describe()})")
        if pinned:
            return (release.sdist if release else None), pinned
        if release is not None:
            return release.sdist, release.sha256
        return None, None


AXES = ("torch", "cuda", "archs", "python", "platform")
# Axes a matrix may leave out, and the value they then take.
AXIS_DEFAULTS: dict[str, list[Any]] = {"platform": [DEFAULT_PLATFORM]}
# Keys beside the axes that narrow what a rule resolves to.
AXIS_MODIFIERS = ("python-range",)
PACKAGE_KEYS = {"recipe", "versions", "source", "sha256", "manylinux", *AXES, *AXIS_MODIFIERS}


def as_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where} is an empty list")
        return value
    if isinstance(value, (str, int, float)):
        return [value]
    raise ConfigError(f"{where} must be a string or a list, not {type(value).__name__}")


def archs_axis(value: Any, where: str) -> list[tuple[int, ...]]:
    """archs = ["10.0"] (one set), [["9.0"], ["10.0"]] (two sets), or "10.0"."""
    items = as_list(value, where)
    if all(isinstance(v, list) for v in items):
        sets = items
    elif any(isinstance(v, list) for v in items):
        raise ConfigError(f"{where} mixes arch sets and single archs")
    else:
        sets = [items]
    out: list[tuple[int, ...]] = []
    for s in sets:
        if not s:
            raise ConfigError(f"{where} has an empty arch set")
        try:
            out.append(tuple(sorted({parse_arch(str(a)) for a in s})))
        except CellError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
    return out


def scalar_axis(value: Any, where: str, parse: Any) -> list[str]:
    """Version strings, each checked by ``parse`` (which may also accept a tracking rule: it
    raises CellError or ConfigError with the reason)."""
    out = []
    for v in as_list(value, where):
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ConfigError(f"{where} must hold version strings")
        if isinstance(v, float):
            # TOML reads 2.10 as the number 2.1: a version written as a float loses digits.
            raise ConfigError(
                f"{where}: {v} is a TOML number; quote versions (\"2.10\" reads as 2.1)"
            )
        try:
            parse(str(v))
        except CellError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
        out.append(str(v).strip())
    return out


def parse_package(name: str, spec: Any, *, root: Path,
                  global_axes: Mapping[str, list[Any]] | None,
                  recipes: Mapping[str, Recipe] | None = None) -> PackageSpec:
    """One ``[packages.NAME]`` table; its own axes override the global ones."""
    where = f"[packages.{name}]"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a table")
    check_keys(spec, PACKAGE_KEYS, where)
    recipe = get_recipe(str(spec.get("recipe", "torch-extension")), recipes)
    if "versions" not in spec:
        raise ConfigError(f"{where} needs versions = [...]")
    written = scalar_axis(spec["versions"], f"{where} versions",
                           lambda v: version_rule(v, f"{where} versions", name))
    version_rules = tuple(version_rule(v, f"{where} versions", name) for v in written)
    source = spec.get("source", "pypi")
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{where} source must be 'pypi' or a directory path")
    tracking = [r.text for r in version_rules if r.tracking]
    if source != "pypi" and tracking:
        raise ConfigError(f"{where} versions {tracking[0]!r}: a rule follows the package's "
                          "releases on PyPI; a source directory is built as the versions it "
                          "names")
    if source != "pypi" and not (root / source).is_dir():
        looked = (root / source).resolve()
        raise ConfigError(
            f"{where} source directory {source!r} does not exist (looked for {looked}; "
            "a relative source counts from the matrix file's directory)"
        )
    sha = spec.get("sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
        raise ConfigError(f"{where} sha256 must be 64 hex digits")
    axes = dict(global_axes or {})
    axes.update(parse_axes({k: spec[k] for k in (*AXES, *AXIS_MODIFIERS) if k in spec},
                            f"packages.{name}"))
    for axis in AXES:
        if axis not in axes and axis in AXIS_DEFAULTS:
            axes[axis] = list(AXIS_DEFAULTS[axis])
        if axis not in axes and global_axes is not None:  # else [axes] has its own problem
            raise ConfigError(f"{where} has no {axis} axis and [axes] sets none")
    floor = check_manylinux(spec["manylinux"], where) if "manylinux" in spec else None
    spread = axes.pop("python-range", None)
    return PackageSpec(
        name=canonicalize_name(name), recipe=recipe,
        versions=tuple(r.text for r in version_rules if not r.tracking), source=source,
        sha256=sha, axes=axes, manylinux=floor, version_rules=version_rules,
        python_range=spread[0] if spread else None,
    )


def parse_axes(raw: Mapping[str, Any], where: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for axis, value in raw.items():
        w = f"{where}.{axis}"
        if axis == "archs":
            out[axis] = archs_axis(value, w)
        elif axis == "torch":
            out[axis] = scalar_axis(value, w, lambda v, w=w: torch_rule(v, w))
        elif axis == "cuda":
            out[axis] = scalar_axis(value, w, lambda v, w=w: cuda_rule(v, w))
        elif axis == "python":
            out[axis] = scalar_axis(value, w, lambda v, w=w: python_rule(v, w))
        elif axis == "platform":
            out[axis] = [parse_platform(v) for v in scalar_axis(value, w, parse_platform)]
        elif axis == "python-range":
            out[axis] = [python_range(value, w)]
    return out
