"""The matrix against the store, as one grid per package: torch down, CUDA x arch set x CPU
across, one chip per Python in each square - built (published), missing (in the matrix, not
built yet), cannot build (no toolchain here, or no such build: the reason on the chip) or not
in the matrix (an axis value the package's cells do not combine to).

The grid is computed (``coverage``), then drawn (``coverage_html``); ``factory matrix
--html`` writes it to a file or into the store's index tree (index.pages.COVERAGE_KEY)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence

from packaging.version import InvalidVersion, Version

from factory.errors import CellError, FactoryError
from factory.matrix.cell import Cell, parse_cuda, parse_python, sm_names
from factory.matrix.load import Matrix, PlannedCell, plan_cell
from factory.matrix.package import PackageSpec
from factory.reports.page import COLORS, esc, legend, page

LABELS = {"built": "built", "missing": "missing", "cannot": "cannot build",
          "absent": "not in the matrix"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chip:
    python: str  # "3.11"
    status: str  # a key of LABELS
    detail: str  # why (a tooltip)
    cell_id: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Grid:
    package: str
    version: str
    rows: tuple[str, ...]  # torch versions
    columns: tuple[tuple[str, tuple[int, ...], str], ...]  # (CUDA, archs, platform)
    chips: Mapping[tuple[str, int], tuple[Chip, ...]]  # (torch, column index) -> per Python

    def count(self, status: str) -> int:
        return sum(c.status == status for chips in self.chips.values() for c in chips)


def _sorted_versions(values: set[str]) -> list[str]:
    return sorted(values, key=Version)


def _exact(values: Sequence[object], parse: Callable[[str], object]) -> list[str]:
    """The axis values that name one version; a rule ('latest:2', 'default', '>=12.8',
    'torch') is resolved in the matrix's cells, which the grid reads too."""
    out = []
    for v in values:
        try:
            parse(str(v))
        except (CellError, InvalidVersion, ValueError):
            continue
        out.append(str(v))
    return out


def _skipped_cells(matrix: Matrix) -> dict[Cell, str]:
    """The cells the matrix names but cannot build (a rule's pick with no such build), with
    the reason; a skip without a whole cell id (no CUDA at all) has no square."""
    out = {}
    for skip in matrix.skipped:
        try:
            out[Cell.from_id(skip.cell)] = skip.reason
        except CellError:
            continue
    return out


def coverage(matrix: Matrix, *, published: set[str],
             readiness: Callable[[PlannedCell], tuple[bool, str]]) -> list[Grid]:
    """One grid per package version. ``published``: the store's content keys; ``readiness``:
    planned cell -> (buildable here, why not)."""
    by_cell = {pc.cell: pc for pc in matrix.cells}
    skipped = _skipped_cells(matrix)
    grids = []
    for pkg in sorted(matrix.packages.values(), key=lambda p: p.name):
        mine = [c for c in [*by_cell, *skipped] if c.package == pkg.name]
        for version in sorted({*_exact(pkg.versions, Version), *(c.version for c in mine)},
                              key=Version):
            cells = [c for c in mine if c.version == version]
            torches = _sorted_versions({*_exact(pkg.axes["torch"], Version),
                                        *(c.torch for c in cells)})
            pythons = sorted({*(f"3.{parse_python(p)[1]}" for p in _exact(pkg.axes["python"],
                                                                          parse_python)),
                              *(c.python for c in cells)}, key=lambda p: int(p.split(".")[1]))
            # every CUDA x arch set x CPU seen on the axes or in a cell: the squares where
            # nothing can be built show, with why
            cudas = {f"{parse_cuda(cu)[0]}.{parse_cuda(cu)[1]}"
                     for cu in _exact(pkg.axes["cuda"], parse_cuda)}
            arch_sets = {tuple(sorted(a)) for a in pkg.axes["archs"]}
            platforms = {str(p) for p in pkg.axes["platform"]}
            for c in cells:
                cudas.add(c.cuda)
                arch_sets.add(c.archs)
                platforms.add(c.platform)
            columns = sorted(itertools.product(cudas, arch_sets, platforms),
                             key=lambda k: (Version(k[0]), k[1], k[2] != "x86_64", k[2]))
            chips: dict[tuple[str, int], tuple[Chip, ...]] = {}
            for torch, (i, (cuda, archs, platform)) in itertools.product(
                    torches, enumerate(columns)):
                row = []
                for python in pythons:
                    cell = Cell(package=pkg.name, version=version, torch=torch, cuda=cuda,
                                archs=archs, python=python, platform=platform)
                    row.append(Chip(python=python, status="cannot", detail=skipped[cell],
                                    cell_id=cell.id) if cell in skipped else
                               _chip(cell, by_cell.get(cell), pkg, matrix, published, readiness))
                chips[(torch, i)] = tuple(row)
            grids.append(Grid(package=pkg.name, version=version, rows=tuple(torches),
                              columns=tuple(columns), chips=chips))
    return grids


def _chip(cell: Cell, pc: PlannedCell | None, pkg: PackageSpec, matrix: Matrix,
          published: set[str], readiness: Callable[[PlannedCell], tuple[bool, str]]) -> Chip:
    if pc is not None:
        if pc.content_key in published:
            return Chip(python=cell.python, status="built", detail="published", cell_id=cell.id)
        ok, why = readiness(pc)
        if not ok:
            return Chip(python=cell.python, status="cannot", detail=f"no toolchain here: {why}",
                        cell_id=cell.id)
        return Chip(python=cell.python, status="missing", detail="not built yet",
                    cell_id=cell.id)
    try:
        plan_cell(cell, pkg, matrix)
    except FactoryError as exc:
        return Chip(python=cell.python, status="cannot", detail=exc.message, cell_id=cell.id)
    return Chip(python=cell.python, status="absent",
                detail="not a cell of the matrix (excluded, or not on its axes)", cell_id=cell.id)


STYLE = "".join([
    "table.grid{border-collapse:collapse;margin:.4rem 0 1.2rem}",
    "table.grid th,table.grid td{border:1px solid #ddd;padding:4px 6px;text-align:center}",
    "table.grid th{background:#fafafa;font-weight:600;font-size:.85rem}",
    "table.grid th.row{text-align:right}",
    ".chip{display:inline-block;min-width:3.2em;margin:1px;padding:1px 4px;border-radius:3px;"
    "font-size:.78rem;font-variant-numeric:tabular-nums}",
    f".chip.built{{background:{COLORS['built']};color:#fff}}",
    f".chip.missing{{background:{COLORS['missing']};color:#000}}",
    f".chip.cannot{{background:{COLORS['cannot']};color:#fff}}",
    f".chip.absent{{background:{COLORS['absent']};color:#888;border:1px dashed #ccc}}",
    ".totals span{margin-right:1.2rem}",
])


def _column_head(column: tuple[str, tuple[int, ...], str]) -> str:
    cuda, archs, platform = column
    arch = sm_names(archs, "+")
    return f"CUDA {esc(cuda)}<br>{esc(arch)}<br>{esc(platform)}"


def coverage_html(grids: Sequence[Grid], *, store: str, matrix: str) -> str:
    totals = {s: sum(g.count(s) for g in grids) for s in LABELS}
    body = ["<h1>Coverage: the matrix against the store</h1>",
            f'<p class="sub">matrix <code>{esc(matrix)}</code>, store <code>{esc(store)}</code>'
            ' &middot; <a href="../finder/">find a wheel</a></p>',
            legend([(LABELS[s], COLORS[s]) for s in LABELS]),
            '<p class="totals">' + "".join(
                f'<span class="total-{s}">{LABELS[s]}: <b>{totals[s]}</b></span>'
                for s in LABELS) + "</p>"]
    for g in grids:
        body.append(f'<h2 id="{esc(g.package)}-{esc(g.version)}">{esc(g.package)} '
                    f"{esc(g.version)}</h2>")
        body.append('<div class="scroll"><table class="grid"><thead><tr><th>torch</th>'
                    + "".join(f"<th>{_column_head(c)}</th>" for c in g.columns)
                    + "</tr></thead><tbody>")
        for torch in g.rows:
            tds = []
            for i in range(len(g.columns)):
                chips = "".join(
                    f'<span class="chip {c.status}" title="{esc(c.cell_id)}: '
                    f'{esc(LABELS[c.status])} ({esc(c.detail)})" data-cell="{esc(c.cell_id)}">'
                    f"cp3{esc(c.python.split('.')[1])}</span>" for c in g.chips[(torch, i)])
                tds.append(f"<td>{chips}</td>")
            body.append(f'<tr><th class="row">{esc(torch)}</th>{"".join(tds)}</tr>')
        body.append("</tbody></table></div>")
    return page("coverage", body, style=STYLE)
