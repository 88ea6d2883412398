"""The matrix cell nearest to a cell id someone typed, for the one line that refuses it.

Nearest is the cell that differs from the typed id in the fewest parsed axes (package, version,
torch, CUDA, archs, Python, CPU). Among those, the one whose changed values are closest, the
axes a person is least free to change compared first: the package, their CPU, their GPU, their
Python, their torch; the package version and the CUDA (it follows torch) last. String likeness
(difflib) only for an id that does not parse: ``cp31`` is nearer to ``cp310`` than to ``cp314``,
and ``cu13`` reads as CUDA 13.x, not the 1.3 ``Cell.from_id`` refuses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from collections.abc import Sequence

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from factory.errors import CellError
from factory.matrix.cell import CUDA_MAJORS, DEFAULT_PLATFORM, ID_RE, Cell, parse_platform

Gap = tuple[float, ...]  # how far one axis of a cell is from the typed value; all 0: the same


@dataclasses.dataclass(frozen=True, kw_only=True)
class TypedCell:
    """A typed cell id's values, read leniently: what does not exist is kept as typed."""

    package: str
    version: str
    torch: str
    cuda: tuple[int, int | None]  # 'cu13': (13, None), the minor left out
    archs: tuple[int, ...]
    python: int  # the minor: 'cp31' is 1
    platform: str

    @classmethod
    def read(cls, cell_id: str) -> TypedCell | None:
        m = ID_RE.fullmatch(cell_id.strip().lower())
        if not m:
            return None
        cu = m.group("cu")
        cuda: tuple[int, int | None]
        if len(cu) >= 3:
            cuda = (int(cu[:2]), int(cu[2:]))
        elif int(cu) in CUDA_MAJORS:
            cuda = (int(cu), None)
        else:
            cuda = (int(cu[0]), int(cu[1]))
        platform = m.group("plat") or DEFAULT_PLATFORM
        with contextlib.suppress(CellError):  # a CPU no cell has: differs from every cell's
            platform = parse_platform(platform)
        return cls(package=canonicalize_name(m.group("pkg")), version=m.group("ver"),
                   torch=m.group("torch"), cuda=cuda,
                   archs=tuple(sorted({int(a[2:]) for a in m.group("archs").split("+")})),
                   python=int(m.group("py")), platform=platform)

    def gaps(self, cell: Cell) -> tuple[Gap, ...]:
        """Each axis's gap to ``cell``, in the order the nearest keeps them (see the module)."""
        return (
            _name_gap(self.package, cell.package),
            (float(self.platform != cell.platform),),
            _archs_gap(self.archs, cell.archs),
            (float(abs(self.python - int(cell.python.split(".")[1]))),),
            _version_gap(self.torch, cell.torch),
            _version_gap(self.version, cell.version),
            _cuda_gap(self.cuda, cell.cuda_tuple),
        )


def nearest_cell_id(cell_id: str, cells: Sequence[Cell]) -> str | None:
    """The id of the cell of ``cells`` nearest to ``cell_id`` (see the module); None: no cells."""
    typed = TypedCell.read(cell_id)
    if typed is None:
        close = difflib.get_close_matches(cell_id.strip().lower(), [c.id for c in cells], n=1,
                                          cutoff=0.0)
        return close[0] if close else None

    def key(cell: Cell) -> tuple[int, tuple[Gap, ...], str]:
        gaps = typed.gaps(cell)
        return sum(any(g) for g in gaps), gaps, cell.id

    return min(cells, key=key).id if cells else None


def _name_gap(typed: str, have: str) -> Gap:
    return (0.0,) if typed == have else (2.0 - difflib.SequenceMatcher(None, typed, have).ratio(),)


def _version_gap(typed: str, have: str) -> Gap:
    """Per release part (major, minor, micro), then the rest (.post, .dev); a version that does
    not parse: by string likeness, after every one that does."""
    if typed == have:
        return (0.0,) * 5
    try:
        a, b = Version(typed), Version(have)
    except InvalidVersion:
        return (2.0 - difflib.SequenceMatcher(None, typed, have).ratio(), 0.0, 0.0, 0.0, 0.0)
    ra, rb = ((*v.release, 0, 0)[:3] for v in (a, b))
    return (0.0, *(float(abs(x - y)) for x, y in zip(ra, rb, strict=True)), float(a != b))


def _cuda_gap(typed: tuple[int, int | None], have: tuple[int, int]) -> Gap:
    """Minor steps apart (12.6 is 4 from 13.0); a major without its minor is nearest its x.0."""
    major, minor = typed
    steps = abs(major * 10 + (minor or 0) - (have[0] * 10 + have[1]))
    return (steps + (0.5 if minor is None else 0.0),)


def _archs_gap(typed: tuple[int, ...], have: tuple[int, ...]) -> Gap:
    """Archs added or left out, then how far each typed sm is from the nearest of the cell's."""
    if typed == have:
        return (0.0, 0.0)
    return (float(len(set(typed) ^ set(have))),
            float(sum(min(abs(t - h) for h in have) for t in typed)))
