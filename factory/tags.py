"""The local version scheme, and the filename <-> cell round trip.

Scheme: ``<version>+cu{MAJ}{MIN}torch{MAJ}.{MIN}[sm{A}[.{B}...]]``.

* ``cu130`` carries the CUDA major and minor (upstream uses only the major: ``cu12``), so every
  (torch minor, CUDA major.minor) pair gets its own tag.
* ``sm100`` / ``sm90.100`` is added only when the arch set differs from the recipe's default
  arch set, so a wheel built with the package's defaults looks like upstream's.
* Requires-Dist pins ``torch==MAJ.MIN.*``; resolvers use that, not the local tag, to choose.

The tag round-trips: ``parse_local(local_tag(...))`` gives the values back, and
``cell_from_wheel_filename`` rebuilds the cell (given the package's default arch set).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from .errors import WheelError

_LOCAL_RE = re.compile(
    r"^cu(?P<cu>\d{2})(?P<cumin>\d{1,2})torch(?P<tmaj>\d+)\.(?P<tmin>\d+)"
    r"(?:sm(?P<archs>\d+(?:\.\d+)*))?$"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalTag:
    cuda: str  # "13.0"
    torch_minor: str  # "2.14"
    archs: tuple[int, ...] | None  # None: the package's default arch set

    @property
    def variant(self) -> str:
        maj, mnr = self.cuda.split(".")
        return f"cu{maj}{mnr}-torch{self.torch_minor}"


def local_tag(
    *, cuda: str, torch_minor: str, archs: Iterable[int], default_archs: Iterable[int] | None
) -> str:
    maj, mnr = cuda.split(".")
    tag = f"cu{maj}{mnr}torch{torch_minor}"
    archs_t = tuple(sorted(set(archs)))
    if default_archs is None or archs_t != tuple(sorted(set(default_archs))):
        tag += "sm" + ".".join(str(a) for a in archs_t)
    return tag


def parse_local(local: str) -> LocalTag:
    m = _LOCAL_RE.match(local.lower())
    if not m:
        raise WheelError(f"local version {local!r} is not a factory tag (expected cuXYtorchA.B[smN])")
    archs = tuple(int(a) for a in m.group("archs").split(".")) if m.group("archs") else None
    return LocalTag(
        cuda=f"{int(m.group('cu'))}.{int(m.group('cumin'))}",
        torch_minor=f"{int(m.group('tmaj'))}.{int(m.group('tmin'))}",
        archs=archs,
    )


def torch_pin(torch_minor: str) -> str:
    return f"torch=={torch_minor}.*"


def variant_of_filename(filename: str) -> str | None:
    """'flash_attn-2.8.3+cu130torch2.14sm100-cp311-...whl' -> 'cu130-torch2.14'; None if untagged."""
    try:
        _, version, _, _ = parse_wheel_filename(filename)
    except Exception as exc:  # packaging raises InvalidWheelFilename / InvalidVersion
        raise WheelError(f"invalid wheel filename {filename!r}: {exc}") from None
    if version.local is None:
        return None
    try:
        return parse_local(version.local).variant
    except WheelError:
        return None


def split_version(version: str) -> tuple[str, str | None]:
    v = Version(version)
    return v.public, v.local


def cell_from_wheel_filename(filename: str, default_archs: Iterable[int] | None = None):  # type: ignore[no-untyped-def]
    """Rebuild the Cell a wheel was built from. Raises WheelError if the name carries no tag."""
    from .cell import Cell

    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except Exception as exc:
        raise WheelError(f"invalid wheel filename {filename!r}: {exc}") from None
    if version.local is None:
        raise WheelError(f"{filename}: no local version tag, not a factory wheel")
    lt = parse_local(version.local)
    archs = lt.archs if lt.archs is not None else tuple(default_archs or ())
    if not archs:
        raise WheelError(f"{filename}: arch set not in the tag and no default arch set given")
    interp = sorted({t.interpreter for t in tags})[0]
    return Cell(
        package=str(name),
        version=version.public,
        torch=lt.torch_minor + ".0" if lt.torch_minor.count(".") == 1 else lt.torch_minor,
        cuda=lt.cuda,
        archs=archs,
        python=f"3.{interp[3:]}",
    )
