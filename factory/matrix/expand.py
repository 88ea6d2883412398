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
from typing import TYPE_CHECKING, Any

from factory.matrix.cell import Cell
from factory.matrix.lock import LockedCell
from factory.matrix.rules import (
    Rule,
    cuda_rule,
    python_rule,
    resolve_cuda,
    resolve_python,
    resolve_torch,
    torch_rule,
)
from factory.upstream.facts import Facts

if TYPE_CHECKING:
    from factory.matrix.load import PackageSpec


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


def tracks(pkg: PackageSpec) -> bool:
    """True when any of the package's axis values or versions is a rule."""
    return any(r.tracking for rs in rules_of(pkg).values() for r in rs) or any(
        r.tracking for r in pkg.version_rules)


def product(pkg: PackageSpec, facts: Facts) -> Iterator[dict[str, Any] | Skipped]:
    """Every combination of the package's resolved axes (as a dict of cell values), and a
    Skipped where a rule names none (a torch with no CUDA default for a CPU)."""
    rules = rules_of(pkg)
    torches = resolve_torch(rules["torch"], facts)
    for version in pkg.versions:
        for torch in torches:
            for platform in pkg.axes["platform"]:
                cudas, why = resolve_cuda(rules["cuda"], facts, torch=torch, platform=platform)
                if why is not None:
                    cuda_rules = ", ".join(r.text for r in rules["cuda"])
                    yield Skipped(package=pkg.name,
                                  cell=label(pkg.name, version, torch, platform, cuda_rules),
                                  reason=why)
                    continue
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
