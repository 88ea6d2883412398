"""A ``[packages.NAME]`` table, parsed: its recipe, source, versions (as written, and as the
rules resolved them) and its own axes."""

from __future__ import annotations

import dataclasses
from typing import Any

from packaging.specifiers import SpecifierSet

from factory.errors import ConfigError
from factory.matrix.rules import Rule
from factory.recipes import Recipe
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
