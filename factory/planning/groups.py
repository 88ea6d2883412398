"""The cells of a matrix grouped by shared kernels: the unit of work of every engine.

Cells that share compiled objects (same package, version, torch, CUDA, arch set and platform;
any Python) form a group: one builder runs them in sequence, so every cell after the first
takes its kernels from the compile cache (docs/BENCHMARKS.md "Compile cache").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from factory.matrix.cell import sm_id
from factory.matrix.load import PlannedCell


def platform_of(pc: PlannedCell) -> str:
    """The wheel's platform tag (its file name's last part)."""
    return pc.wheel.removesuffix(".whl").rsplit("-", 1)[-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Group:
    """Cells that share every compiled kernel: one package/version/torch/CUDA/archs/platform."""

    key: tuple[str, ...]
    cells: tuple[PlannedCell, ...]  # by Python version

    @property
    def platform(self) -> str:
        return self.key[-1]

    @property
    def name(self) -> str:
        first = self.cells[0].cell
        return (f"{first.package}-{first.version}-torch{first.torch}-cu"
                f"{first.cuda.replace('.', '')}-{sm_id(first.archs)}"
                f"-{self.platform}")


def group_cells(cells: Iterable[PlannedCell]) -> tuple[Group, ...]:
    by_key: dict[tuple[str, ...], list[PlannedCell]] = {}
    for pc in cells:
        c = pc.cell
        key = (c.package, c.version, c.torch, c.cuda, ",".join(map(str, c.archs)),
               platform_of(pc))
        by_key.setdefault(key, []).append(pc)
    return tuple(
        Group(key=k, cells=tuple(sorted(v, key=lambda pc: tuple(
            int(x) for x in pc.cell.python.split(".")))))
        for k, v in sorted(by_key.items()))
