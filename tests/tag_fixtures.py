"""A wheel file name read back into the cell it was built from: the local version tag's round
trip (factory/matrix/tags.py), which the tests check and the factory itself never needs."""

from __future__ import annotations

import re
from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from factory.errors import CellError, WheelError
from factory.matrix.cell import Cell
from factory.matrix.tags import _MACHINES, _parse_filename, parse_local, platform_tag_parts


def cell_from_wheel_filename(
    filename: str, default_archs: Iterable[int] | None = None, *, torch: str | None = None
) -> Cell:
    """Rebuild the Cell a wheel was built from. Raises WheelError if the name carries no tag.

    The tag holds only the torch minor; ``torch`` (the full version, e.g. from provenance)
    restores the patch level, else it reads as ``MAJ.MIN.0``.
    """
    name, version, _, tags = _parse_filename(filename)
    if version.local is None:
        raise WheelError(f"{filename}: no local version tag, not a factory wheel")
    lt = parse_local(version.local)
    archs = lt.archs if lt.archs is not None else tuple(default_archs or ())
    if not archs:
        raise WheelError(f"{filename}: arch set not in the tag and no default arch set given")
    if torch is None:
        torch = f"{lt.torch_minor}.0"
    else:
        try:
            tv = Version(torch)
        except InvalidVersion:
            raise WheelError(f"unparseable torch version {torch!r}") from None
        if f"{tv.major}.{tv.minor}" != lt.torch_minor:
            raise WheelError(f"{filename}: tagged for torch {lt.torch_minor}, not torch {torch}")
    interps = sorted({t.interpreter for t in tags})
    plats = sorted({m for m in (platform_tag_parts(t.platform)[1] for t in tags) if m in _MACHINES})
    if len(interps) != 1 or not re.fullmatch(r"cp3\d+", interps[0]):
        raise WheelError(
            f"{filename}: expected one CPython tag like cp311, got {'.'.join(interps)}"
        )
    try:
        return Cell(
            package=str(name),
            version=version.public,
            torch=torch,
            cuda=lt.cuda,
            archs=archs,
            python=f"3.{interps[0][3:]}",
            **({"platform": plats[0]} if len(plats) == 1 else {}),
        )
    except CellError as exc:
        raise WheelError(f"{filename}: {exc.message}") from None
