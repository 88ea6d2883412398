"""What a recipe is: how one package takes its build knobs, and its known fixes as data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from factory.errors import BuildError, ConfigError
from factory.matrix.cell import Cell, sm_names


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceFix:
    """A textual fix applied to the (copied) source tree when ``when`` matches the cell.

    ``when`` is a dict of specifiers keyed by 'torch', 'cuda' or 'version'.
    """

    reason: str
    file: str
    replace: str
    with_: str
    when: dict[str, str]

    def applies(self, cell: Cell) -> bool:
        values = {"torch": cell.torch, "cuda": cell.cuda, "version": cell.version}
        return all(Version(values[k]) in SpecifierSet(spec) for k, spec in self.when.items())

    def apply(self, tree: Path) -> bool:
        """Apply to ``tree``; True if the file changed. A fix whose text is missing is an error."""
        path = tree / self.file
        text = path.read_text()
        if self.with_ in text and self.replace not in text:
            return False  # already applied (resumed build directory)
        if self.replace not in text:
            raise BuildError(
                f"recipe fix '{self.reason}' found no {self.replace!r} in {self.file}: "
                "the recipe needs updating for this source"
            )
        path.write_text(text.replace(self.replace, self.with_))
        return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    revision: str  # bump when the recipe changes what it produces; part of the content key
    default_archs: tuple[int, ...] | None  # what the package builds when told nothing
    supported_archs: frozenset[int] | None  # None: whatever nvcc supports
    build_requires: tuple[str, ...]  # installed from the wheelhouse next to torch
    fixes: tuple[SourceFix, ...] = ()
    # Upstream memory figures are per nvcc thread per arch; the planner reads this name.
    memory_model_key: str = ""

    def supports_threads(self) -> bool:
        """True when the package passes NVCC_THREADS through to nvcc --threads."""
        return False

    def env(self, cell: Cell, *, max_jobs: int, nvcc_threads: int,
            local_version: str) -> dict[str, str]:
        raise NotImplementedError

    def fixes_for(self, cell: Cell) -> list[SourceFix]:
        return [f for f in self.fixes if f.applies(cell)]

    def check_cell(self, cell: Cell) -> None:
        """Raise ConfigError-like CellError when the recipe cannot build the cell."""
        if self.supported_archs is not None:
            bad = [a for a in cell.archs if a not in self.supported_archs]
            if bad:
                raise ConfigError(
                    f"{cell.package} cannot build arch(s) {sm_names(bad)}; "
                    f"it supports {sm_names(sorted(self.supported_archs))}"
                )
