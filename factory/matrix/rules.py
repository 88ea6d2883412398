"""Tracking rules: matrix axis values that follow the indexes instead of naming a version.

| axis | rule | resolves to |
|---|---|---|
| torch | ``"2.14.1"`` | that release |
| torch | ``"latest"``, ``"latest:N"`` | the newest patch of each of the newest N minors |
| torch | ``">=2.12"`` (a PEP 440 specifier) | the newest patch of each minor that matches |
| versions | ``"latest"``, ``"latest:N"`` | the newest N releases with an sdist |
| versions | ``">=2.8"`` | every release with an sdist that matches |
| cuda | ``"13.0"`` | that build |
| cuda | ``"default"`` | PyPI's build of that torch (for that CPU) |
| cuda | ``"all"``, ``">=12.8"`` | every CUDA build of that torch (that matches) |
| python | ``"3.12"`` | that CPython |
| python | ``"torch"`` | every CPython that torch's build ships for, within ``python-range`` |

A torch rule gives the newest patch per minor because a wheel is made per torch minor (its
local tag and its ``torch==MAJ.MIN.*`` pin): two patches of one minor would be one wheel.
Pre-releases and yanked releases never match a rule; an exact version is taken as written.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from factory.errors import CellError, ConfigError
from factory.matrix.cell import parse_cuda, parse_python, parse_version
from factory.upstream.facts import Facts, PackageRelease

_LATEST = re.compile(r"latest(?::(\d+))?")
_SPEC_START = ("<", ">", "=", "!", "~")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    text: str
    kind: str  # "exact" | "latest" | "spec" | "default" | "all" | "torch"
    count: int = 1  # latest:N
    spec: SpecifierSet | None = None

    @property
    def tracking(self) -> bool:
        return self.kind != "exact"


def _spec(text: str, where: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ConfigError(f"{where}: {text!r} is not a version specifier (like '>=2.12')") from None


def _latest(text: str, where: str) -> Rule | None:
    m = _LATEST.fullmatch(text)
    if not m:
        return None
    count = int(m.group(1) or 1)
    if count < 1:
        raise ConfigError(f"{where}: {text!r} asks for no version (latest:N needs N >= 1)")
    return Rule(text=text, kind="latest", count=count)


def _release_rule(text: str, where: str, what: str, hint: str = "") -> Rule:
    """'latest', 'latest:N', a specifier, or an exact version of ``what``."""
    t = text.strip()
    rule = _latest(t, where)
    if rule:
        return rule
    if t.startswith(_SPEC_START):
        return Rule(text=t, kind="spec", spec=_spec(t, where))
    try:
        parse_version(t, what)
    except CellError as exc:
        raise ConfigError(f"{where}: {exc.message}{hint}") from None
    return Rule(text=t, kind="exact")


def torch_rule(text: str, where: str) -> Rule:
    return _release_rule(text, where, "torch", " (or a rule: 'latest', 'latest:N', '>=2.12')")


def version_rule(text: str, where: str, package: str) -> Rule:
    return _release_rule(text, where, package)


def _exact(t: str, where: str, parse: Callable[[str], object], hint: str) -> Rule:
    try:
        parse(t)
    except CellError as exc:
        raise ConfigError(f"{where}: {exc.message} {hint}") from None
    return Rule(text=t, kind="exact")


def cuda_rule(text: str, where: str) -> Rule:
    t = text.strip()
    if t in ("default", "all"):
        return Rule(text=t, kind=t)
    if t.startswith(_SPEC_START):
        return Rule(text=t, kind="spec", spec=_spec(t, where))
    return _exact(t, where, parse_cuda, "(or a rule: 'default', 'all', '>=12.8')")


def python_rule(text: str, where: str) -> Rule:
    t = text.strip()
    if t == "torch":
        return Rule(text=t, kind="torch")
    return _exact(t, where, parse_python, "(or 'torch': every CPython torch ships for)")


def python_range(value: object, where: str) -> SpecifierSet:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a version specifier string like '>=3.10,<3.14'")
    return _spec(value, where)


# -- resolution -------------------------------------------------------------------------------

def _newest_per_minor(versions: Iterable[Version]) -> dict[tuple[int, int], Version]:
    best: dict[tuple[int, int], Version] = {}
    for v in versions:
        if v.is_prerelease or v.is_devrelease:
            continue
        key = (v.major, v.minor)
        if key not in best or v > best[key]:
            best[key] = v
    return best


def resolve_torch(rules: Sequence[Rule], facts: Facts) -> list[str]:
    """The torch versions the rules name, newest first (exact ones as written)."""
    newest = _newest_per_minor(facts.torch_versions())
    minors = sorted(newest, reverse=True)
    out: list[str] = []
    for rule in rules:
        if rule.kind == "exact":
            picked = [rule.text]
        elif rule.kind == "latest":
            picked = [str(newest[m]) for m in minors[:rule.count]]
        else:
            assert rule.spec is not None
            matching = _newest_per_minor(v for v in facts.torch_versions() if v in rule.spec)
            picked = [str(matching[m]) for m in sorted(matching, reverse=True)]
            if not picked:
                raise ConfigError(f"torch {rule.text!r} matches no release in "
                                  f"{facts.describe()}")
        out += [p for p in picked if p not in out]
    return out


def resolve_versions(rules: Sequence[Rule], package: str,
                     releases: Mapping[str, PackageRelease] | None) -> list[str]:
    """The package versions the rules name, newest first. Rules need the package's releases
    (the facts); exact versions do not."""
    out: list[str] = []
    usable = sorted((Version(v) for v, r in (releases or {}).items()
                     if r.sdist and not r.yanked and not Version(v).is_prerelease),
                    reverse=True)
    for rule in rules:
        if rule.kind == "exact":
            picked = [rule.text]
        elif releases is None:
            raise ConfigError(
                f"[packages.{package}] versions {rule.text!r} needs {package}'s releases, and "
                "the facts at hand have none", tip="'factory lock' reads them from PyPI")
        elif rule.kind == "latest":
            picked = [str(v) for v in usable[:rule.count]]
        else:
            assert rule.spec is not None
            picked = [str(v) for v in usable if v in rule.spec]
        if not picked:
            raise ConfigError(f"[packages.{package}] versions {rule.text!r} matches no release "
                              "with an sdist")
        out += [p for p in picked if p not in out]
    return out


def resolve_cuda(rules: Sequence[Rule], facts: Facts, *, torch: str, platform: str
                 ) -> tuple[list[str], list[tuple[str, str]]]:
    """The CUDA builds the rules name for one torch and CPU, and (rule, why) for each rule
    that names none (a CPU-only PyPI wheel, say). Exact values are kept for the cell check."""
    builds = [b for b in facts.builds_of(torch) if platform in b.files]
    cudas = sorted({b.cuda for b in builds}, key=Version)
    out: list[str] = []
    empty: list[tuple[str, str]] = []
    for rule in rules:
        why = f"no CUDA build of torch {torch} for {platform} matches {rule.text!r}"
        if rule.kind == "exact":
            major, minor = parse_cuda(rule.text)
            picked = [f"{major}.{minor}"]
        elif rule.kind == "default":
            pypi = facts.pypi_build(torch, platform)
            release = facts.torch.get(torch)
            picked = [pypi.cuda] if pypi else []
            why = (f"PyPI's torch {torch} for {platform} is a CPU build (no CUDA default)"
                   if release is not None and platform in release.wheels else
                   f"PyPI has no torch {torch} wheel for {platform}")
        elif rule.kind == "all":
            picked = cudas
        else:
            assert rule.spec is not None
            picked = [c for c in cudas if Version(c) in rule.spec]
        if not picked:
            empty.append((rule.text, why))
        out += [p for p in picked if p not in out]
    return out, empty


def resolve_python(rules: Sequence[Rule], facts: Facts, *, torch: str, cuda: str,
                   platform: str, allowed: SpecifierSet | None) -> list[str]:
    """The CPythons the rules name for one torch build; 'torch' is every one it ships for
    (within ``allowed``). Exact ones are kept for the cell check."""
    shipped: set[str] = set()
    for b in facts.builds_of(torch):
        if b.cuda == cuda:
            shipped.update(b.files.get(platform, {}))
    out: list[str] = []
    for rule in rules:
        if rule.kind == "exact":
            picked = [f"3.{parse_python(rule.text)[1]}"]
        else:
            picked = sorted(shipped, key=lambda p: int(p.split(".")[1]))
            if allowed is not None:
                picked = [p for p in picked if Version(p) in allowed]
        out += [p for p in picked if p not in out]
    return out
