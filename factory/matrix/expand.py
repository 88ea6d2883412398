"""A package's axes -> the concrete cells they name, resolving the tracking rules against the
facts; and the lock's cells back into cells.

The product is taken per torch version and CPU, because what a rule means depends on them:
``cuda = ["default"]`` is PyPI's build of that torch for that CPU, ``python = ["torch"]`` the
CPythons that build ships for. A combination the rules give that cannot be built is a
``Skipped`` with its reason, never an error of the whole matrix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from factory.errors import ConfigError, UsageError
from factory.matrix.cell import Cell
from factory.matrix.lock import LockedCell
from factory.matrix.package import PackageSpec
from factory.matrix.rules import (
    Rule,
    cuda_rule,
    python_rule,
    resolve_cuda,
    resolve_python,
    resolve_torch,
    resolve_versions,
    torch_rule,
    version_rule,
)
from factory.upstream.facts import Facts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Skipped:
    """A cell the matrix names that cannot be built, and why."""

    package: str
    cell: str  # its id, or its values where a rule gave no CUDA
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"package": self.package, "cell": self.cell, "reason": self.reason}


def label(package: str, version: str, torch: str, platform: str, cuda_rules: str) -> str:
    """The shape of the cells a CUDA rule named none of: 'flash-attn-2.8.3.post2-torch2.10.0
    -aarch64 (cuda default)'."""
    return f"{package}-{version}-torch{torch}-{platform} (cuda {cuda_rules})"


def rules_of(pkg: PackageSpec) -> dict[str, list[Rule]]:
    where = f"packages.{pkg.name}"
    return {
        "torch": [torch_rule(str(v), f"{where}.torch") for v in pkg.axes["torch"]],
        "cuda": [cuda_rule(str(v), f"{where}.cuda") for v in pkg.axes["cuda"]],
        "python": [python_rule(str(v), f"{where}.python") for v in pkg.axes["python"]],
    }


def product(pkg: PackageSpec, facts: Facts) -> Iterator[dict[str, Any] | Skipped]:
    """Every combination of the package's resolved axes (as a dict of cell values), and a
    Skipped where a rule names none (a torch with no CUDA default for a CPU)."""
    rules = rules_of(pkg)
    torches = resolve_torch(rules["torch"], facts)
    for version in pkg.versions:
        for torch in torches:
            for platform in pkg.axes["platform"]:
                cudas, empty = resolve_cuda(rules["cuda"], facts, torch=torch,
                                            platform=platform)
                for text, why in empty:
                    yield Skipped(package=pkg.name,
                                  cell=label(pkg.name, version, torch, platform, text),
                                  reason=why)
                for cuda in cudas:
                    pythons = resolve_python(rules["python"], facts, torch=torch, cuda=cuda,
                                             platform=platform, allowed=pkg.python_range)
                    for python in pythons:
                        for archs in pkg.axes["archs"]:
                            yield {"version": version, "torch": torch, "cuda": cuda,
                                   "archs": archs, "python": python, "platform": platform}


def locked_cell(c: LockedCell) -> Cell:
    return Cell(package=c.package, version=c.version, torch=c.torch, cuda=c.cuda, archs=c.archs,
                python=c.python, platform=c.platform)


def one_off(facts: Facts, pkg: PackageSpec, *, version: str | None, torch: str, cuda: str,
            platform: str = "x86_64") -> tuple[str, str, str]:
    """A one-off request's (version, torch, CUDA), resolved by the matrix's rules: ``latest``
    for torch, ``default`` for the CUDA, no version for the package's newest release. A rule
    that names more than one value is refused: a request is one cell."""
    def one(values: list[str], flag: str, text: str) -> str:
        if len(values) != 1:
            raise UsageError(f"{flag} {text!r} names {len(values)} values "
                             f"({', '.join(values)}); a request is one cell")
        return values[0]

    rule = version_rule(version or "latest", "the request's version", pkg.name)
    releases = facts.packages.get(pkg.name) if pkg.source == "pypi" else None
    if rule.tracking and releases is None:
        chosen = list(pkg.versions[:1])  # a source directory: the version the matrix names
    else:
        chosen = resolve_versions([rule], pkg.name, releases)
    torches = resolve_torch([torch_rule(torch, "--torch")], facts)
    t = one(torches, "--torch", torch)
    cudas, empty = resolve_cuda([cuda_rule(cuda, "--cuda")], facts, torch=t, platform=platform)
    if empty:
        raise ConfigError(empty[0][1])
    return one(chosen, "the version", version or "latest"), t, one(cudas, "--cuda", cuda)
