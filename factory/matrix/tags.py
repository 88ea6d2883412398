"""The local version scheme, and the filename <-> cell round trip.

Scheme: ``<version>+cu{MAJ}{MIN}torch{MAJ}.{MIN}[sm{A}[.{B}...]]``.

* ``cu130`` carries the CUDA major and minor (upstream uses only the major: ``cu12``), so every
  (torch minor, CUDA major.minor) pair gets its own tag. The CUDA major is always two digits
  (CUDA 10 and later), which is what keeps ``cu1210`` (12.10) apart from ``cu121`` (12.1).
* ``sm100`` / ``sm90.100`` is added only when the arch set differs from the recipe's default
  arch set, so a wheel built with the package's defaults looks like upstream's. The archs are
  written sorted and without repeats: one arch set has exactly one spelling.
* Requires-Dist pins ``torch==MAJ.MIN.*``; resolvers use that, not the local tag, to choose.

The variant name (the index's ``<variant>/simple/`` directory) holds everything a resolver
could otherwise confuse: ``cu130-torch2.14`` for the package's default arch set, plus
``-sm100`` / ``-sm90.100`` for any other arch set (PEP 440 compares ``11sm90`` above ``11sm100``
as text, so two arch sets behind one URL would resolve to sm90 on every host). The CPU is not
in it: the x86_64 and aarch64 wheels of one cell differ only in their platform tag, which pip
and uv already choose by, so one URL serves every host of that variant (PyPI's own layout). One
URL, one build per version and CPU.

The tag round-trips: ``parse_local(local_tag(...))`` gives the values back.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from factory.errors import WheelError
from factory.matrix.cell import DEFAULT_PLATFORM, parse_sm_tag, sm_tag

_LOCAL_RE = re.compile(
    r"cu(?P<cu>[1-9]\d)(?P<cumin>\d{1,2})torch(?P<tmaj>\d+)\.(?P<tmin>\d+)"
    r"(?:sm(?P<archs>\d+(?:\.\d+)*))?"
)
_MINOR_RE = re.compile(r"\d+\.\d+")
# Every variant name the index has ever used: 'cu130-torch2.14' (also the pre-arch names of
# already published wheels), '-sm100', '-sm90.100'.
VARIANT_RE = re.compile(r"^cu\d{3,4}-torch\d+\.\d+(?:-sm\d+(?:\.\d+)*)?$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalTag:
    cuda: str  # "13.0"
    torch_minor: str  # "2.14"
    archs: tuple[int, ...] | None  # None: the package's default arch set

    @property
    def variant(self) -> str:
        return variant_name(cuda=self.cuda, torch_minor=self.torch_minor, archs=self.archs)


def variant_name(*, cuda: str, torch_minor: str, archs: Iterable[int] | None) -> str:
    """'cu130-torch2.14' (default arch set), 'cu130-torch2.14-sm100'."""
    maj, mnr = cuda.split(".")
    name = f"cu{maj}{mnr}-torch{torch_minor}"
    if archs is not None:
        name += "-" + sm_tag(sorted(set(archs)))
    return name


# One reading of a Linux platform tag: its family and glibc part ('manylinux_2_28', 'manylinux2014',
# 'linux') and the CPU after it.
_PLAT_RE = re.compile(
    r"(?P<base>(?P<family>manylinux|musllinux|linux)"
    r"(?:_(?P<major>\d+)_(?P<minor>\d+)|(?P<legacy>1|2010|2014))?)_(?P<machine>[a-z0-9_]+)"
)
_LEGACY_GLIBC = {"1": (2, 5), "2010": (2, 12), "2014": (2, 17)}
_MACHINES = ("x86_64", "aarch64", "i686", "ppc64le", "s390x", "armv7l")


def platform_tag_parts(platform_tag: str) -> tuple[tuple[int, int] | None, str]:
    """('manylinux_2_28_x86_64') -> ((2, 28), 'x86_64'); legacy aliases included; no glibc for
    'linux_*' and musllinux; a tag that is not Linux comes back whole as the machine."""
    m = _PLAT_RE.fullmatch(platform_tag)
    if not m:
        return None, platform_tag
    glibc = None
    if m["family"] == "manylinux":
        glibc = (int(m["major"]), int(m["minor"])) if m["major"] else _LEGACY_GLIBC[m["legacy"]]
    return glibc, m["machine"]


def wheel_platform(platform_tags: Iterable[str]) -> str:
    """The machine a wheel's platform tags name: 'manylinux_2_28_aarch64' -> 'aarch64'."""
    machines = {platform_tag_parts(t)[1] for t in platform_tags} - {"any"}
    return machines.pop() if len(machines) == 1 else DEFAULT_PLATFORM


def glibc_floor(platform_tags: Iterable[str]) -> str | None:
    """The oldest glibc a wheel installs on ('2.28'), from its manylinux tags; None if none."""
    floors = [g for g in (platform_tag_parts(t)[0] for t in platform_tags) if g]
    return "{}.{}".format(*min(floors)) if floors else None


def local_tag(
    *, cuda: str, torch_minor: str, archs: Iterable[int], default_archs: Iterable[int] | None
) -> str:
    m = re.fullmatch(r"(\d+)\.(\d+)", cuda)
    if not m or not (10 <= int(m.group(1)) <= 99 and int(m.group(2)) <= 99):
        # A one-digit major would make 'cu920' mean both 9.20 and 92.0.
        raise WheelError(f"CUDA {cuda!r} cannot be tagged: the scheme needs CUDA 10.0 to 99.99")
    if not _MINOR_RE.fullmatch(torch_minor):
        raise WheelError(f"torch minor {torch_minor!r} must look like '2.14' (no patch level)")
    archs_t = tuple(sorted(set(archs)))
    if not archs_t:
        raise WheelError("cannot tag a wheel with an empty arch set")
    tag = f"cu{int(m.group(1))}{int(m.group(2))}torch{_canonical_minor(torch_minor)}"
    if default_archs is None or archs_t != tuple(sorted(set(default_archs))):
        tag += sm_tag(archs_t)
    return tag


def _canonical_minor(torch_minor: str) -> str:
    # '2.014' would be normalised to '2.14' by packaging; write it the way it will read back.
    maj, mnr = torch_minor.split(".")
    return f"{int(maj)}.{int(mnr)}"


def parse_local(local: str) -> LocalTag:
    m = _LOCAL_RE.fullmatch(local.lower())
    if not m:
        raise WheelError(
            f"local version {local!r} is not a factory tag (expected cuXYtorchA.B[smN])"
        )
    archs: tuple[int, ...] | None = None
    if m.group("archs"):
        archs = parse_sm_tag("sm" + m.group("archs"))
        if archs != tuple(sorted(set(archs))):
            raise WheelError(f"local version {local!r}: the archs must be sorted, without repeats")
    return LocalTag(
        cuda=f"{int(m.group('cu'))}.{int(m.group('cumin'))}",
        torch_minor=f"{int(m.group('tmaj'))}.{int(m.group('tmin'))}",
        archs=archs,
    )


def _known_machine(plat: str) -> re.Match[str]:
    m = _PLAT_RE.fullmatch(plat)
    if not m or m["machine"] not in _MACHINES:
        raise WheelError(f"platform tag {plat!r} names no CPU this factory knows")
    return m


def plat_for_platform(plat: str, platform: str) -> str:
    """The same platform tag for another CPU: ('manylinux_2_36_x86_64', 'aarch64') ->
    'manylinux_2_36_aarch64'. The glibc floor is the build environment's; only the machine
    changes."""
    return f"{_known_machine(plat)['base']}_{platform}"


def platform_of_plat(plat: str) -> str:
    """'manylinux_2_28_aarch64' -> 'aarch64'."""
    return _known_machine(plat)["machine"]


def torch_pin(torch_minor: str) -> str:
    return f"torch=={torch_minor}.*"


def _parse_filename(filename: str):  # type: ignore[no-untyped-def]
    try:
        return parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise WheelError(f"invalid wheel filename {filename!r}: {exc}") from None


def local_tag_of_filename(filename: str) -> LocalTag | None:
    """The factory tag of a wheel file name; None when it carries none."""
    _, version, _, _ = _parse_filename(filename)
    if version.local is None:
        return None
    try:
        return parse_local(version.local)
    except WheelError:
        return None


def variant_of_filename(filename: str) -> str | None:
    """'flash_attn-2.8.3+cu130torch2.14sm100-cp311-...whl' -> 'cu130-torch2.14-sm100'.

    None when the wheel carries no factory tag."""
    lt = local_tag_of_filename(filename)
    return None if lt is None else lt.variant
