"""A Cell: one (package, version, torch, CUDA, arch set, Python, CPU platform) combination.

The cell id is human-readable and parseable back (``Cell.from_id``); the content key hashes the
values plus the recipe revision and decides "already built". The CPU platform (``x86_64``, the
default, or ``aarch64``) shows in the id and the key only when it is not the default, so every
x86_64 cell keeps the id and key it had before the axis existed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from factory.errors import CellError

# The CPU platforms a cell can target, as wheel tags and `uname -m` spell them.
PLATFORMS = ("x86_64", "aarch64")
DEFAULT_PLATFORM = "x86_64"
_PLATFORM_ALIASES = {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}

_ARCH_RE = re.compile(r"^(?:sm_?)?(\d{1,3})(?:\.(\d))?$")
# A cell id's parts as ``Cell.id`` writes them (``Cell.from_id`` and ``matrix/nearest.py`` read it).
ID_RE = re.compile(
    r"(?P<pkg>[a-z0-9][a-z0-9._-]*?)-(?P<ver>[0-9][^-]*)-torch(?P<torch>[0-9][^-]*)"
    r"-cu(?P<cu>\d{2,4})-(?P<archs>sm\d+(?:\+sm\d+)*)-cp3(?P<py>\d{1,2})"
    r"(?:-(?P<plat>[a-z0-9_]+))?")

# What a cell id may name (``check_plausible``): the Pythons torch has been built for, the CUDA
# majors of torch's builds, and the compute capabilities NVIDIA's GPUs have
# (factory/data/gpus.toml's products are all among them).
PYTHON_MINORS = range(8, 16)
CUDA_MAJORS = range(11, 14)
KNOWN_SMS = frozenset({50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103,
                       110, 120, 121})


def parse_arch(text: str) -> int:
    """'10.0' / '100' / 'sm_100' / 'sm100' -> 100; '9.0' -> 90; '8.6' -> 86."""
    t = str(text).strip().lower()
    m = _ARCH_RE.match(t)
    if not m:
        raise CellError(f"unparseable GPU arch {text!r}: use compute capability like '10.0' or "
                        "'sm_100'")
    major, minor = m.group(1), m.group(2)
    if minor is not None:
        value = int(major) * 10 + int(minor)
    else:
        value = int(major)
        if value < 10:  # bare '9' means 9.0
            value *= 10
    if not 30 <= value <= 200:
        raise CellError(f"GPU arch {text!r} is out of range")
    return value


def parse_arch_list(text: str) -> tuple[int, ...]:
    """'9.0;10.0', '9.0,10.0' or 'sm_90 sm_100' -> (90, 100): sorted, without repeats."""
    parts = text.replace(";", " ").replace(",", " ").replace("+", " ").split()
    return tuple(sorted({parse_arch(p) for p in parts}))


def parse_sm_tag(text: str) -> tuple[int, ...]:
    """'sm90.100' (the local tag's and the variant's spelling) -> (90, 100)."""
    if not re.fullmatch(r"sm\d+(?:\.\d+)*", text):
        raise CellError(f"{text!r} is not an arch marker like 'sm90.100'")
    return tuple(int(a) for a in text[2:].split("."))


# Every way an arch or an arch set is written, in one place (parse_arch, parse_arch_list and
# parse_sm_tag read them back).
def arch_cc(sm: int) -> str:
    """100 -> '10.0': the compute capability (TORCH_CUDA_ARCH_LIST's items)."""
    return f"{sm // 10}.{sm % 10}"


def cc_list(archs: Iterable[int]) -> str:
    """(90, 100) -> '9.0;10.0' (TORCH_CUDA_ARCH_LIST)."""
    return ";".join(arch_cc(a) for a in archs)


def sm_name(sm: int) -> str:
    """100 -> 'sm_100': nvcc's and cuobjdump's name, the one people read."""
    return f"sm_{sm}"


def sm_names(archs: Iterable[int], sep: str = ", ") -> str:
    """(90, 100) -> 'sm_90, sm_100' (or 'sm_90+sm_100' with sep='+')."""
    return sep.join(sm_name(a) for a in archs)


def sm_id(archs: Iterable[int]) -> str:
    """(90, 100) -> 'sm90+sm100': the cell id's part."""
    return "+".join(f"sm{a}" for a in archs)


def sm_tag(archs: Iterable[int]) -> str:
    """(90, 100) -> 'sm90.100': the local version tag's and the variant name's part."""
    return "sm" + ".".join(str(a) for a in archs)


def parse_cuda(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d{1,2})\.(\d{1,2})(?:\.\d+)?", str(text).strip())
    if not m:
        raise CellError(f"unparseable CUDA version {text!r}: use MAJOR.MINOR like '12.8'")
    return int(m.group(1)), int(m.group(2))


def parse_python(text: str) -> tuple[int, int]:
    t = str(text).strip()
    m = re.fullmatch(r"(?:cp)?3\.?(\d{1,2})", t)
    if not m:
        raise CellError(f"unparseable Python version {text!r}: use '3.12' or 'cp312'")
    return 3, int(m.group(1))


def parse_platform(text: str) -> str:
    """'x86_64' / 'amd64' -> 'x86_64'; 'aarch64' / 'arm64' -> 'aarch64'."""
    t = str(text).strip().lower()
    t = _PLATFORM_ALIASES.get(t, t)
    if t not in PLATFORMS:
        raise CellError(f"unknown CPU platform {text!r}: use one of {', '.join(PLATFORMS)}")
    return t


def parse_version(text: str, what: str) -> Version:
    try:
        v = Version(str(text))
    except (InvalidVersion, ValueError):  # ValueError: a number longer than int() accepts
        raise CellError(f"unparseable {what} version {str(text)[:80]!r}") from None
    if v.local is not None:
        raise CellError(f"{what} version {text!r} must not carry a local part (+...)")
    return v


@dataclasses.dataclass(frozen=True, kw_only=True, order=True)
class Cell:
    package: str  # canonical project name, e.g. "flash-attn"
    version: str  # package version, e.g. "2.8.3.post2"
    torch: str  # full torch version, e.g. "2.14.1"
    cuda: str  # "13.0"
    archs: tuple[int, ...]  # sorted sm numbers, e.g. (100,)
    python: str  # "3.11"
    platform: str = DEFAULT_PLATFORM  # the CPU the wheel runs on: "x86_64" or "aarch64"

    def __post_init__(self) -> None:
        object.__setattr__(self, "package", canonicalize_name(self.package))
        parse_version(self.version, self.package)
        parse_version(self.torch, "torch")
        maj, mnr = parse_cuda(self.cuda)
        object.__setattr__(self, "cuda", f"{maj}.{mnr}")
        _, pmin = parse_python(self.python)
        object.__setattr__(self, "python", f"3.{pmin}")
        archs = tuple(sorted({int(a) for a in self.archs}))
        if not archs:
            raise CellError("a cell needs at least one GPU arch")
        object.__setattr__(self, "archs", archs)
        object.__setattr__(self, "platform", parse_platform(self.platform))

    # -- derived values ------------------------------------------------------------------
    @property
    def cuda_tuple(self) -> tuple[int, int]:
        return parse_cuda(self.cuda)

    @property
    def cuda_tag(self) -> str:
        """'13.0' -> 'cu130' (PyTorch's spelling)."""
        maj, mnr = self.cuda_tuple
        return f"cu{maj}{mnr}"

    @property
    def torch_minor(self) -> str:
        v = Version(self.torch)
        return f"{v.major}.{v.minor}"

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def arch_list(self) -> str:
        """TORCH_CUDA_ARCH_LIST spelling: '9.0;10.0'."""
        return cc_list(self.archs)

    @property
    def id(self) -> str:
        archs = sm_id(self.archs)
        suffix = "" if self.platform == DEFAULT_PLATFORM else f"-{self.platform}"
        return (
            f"{self.package}-{self.version}-torch{self.torch}-{self.cuda_tag}-{archs}-{self.python_tag}"
            f"{suffix}"
        )

    @property
    def short_id(self) -> str:
        """'flash-attn@cu130-torch2.14-sm100-cp311': the package at its variant and Python, what
        the lines of its build start with; the package version and torch patch left out
        (``Matrix.short_id`` puts them back where two of a matrix's cells would read alike)."""
        archs = "+".join(f"sm{a}" for a in self.archs)
        suffix = "" if self.platform == DEFAULT_PLATFORM else f"-{self.platform}"
        return (f"{self.package}@{self.cuda_tag}-torch{self.torch_minor}-{archs}-"
                f"{self.python_tag}{suffix}")

    @classmethod
    def from_id(cls, cell_id: str) -> Cell:
        m = ID_RE.fullmatch(cell_id.strip().lower())
        if not m:
            raise CellError(
                f"unparseable cell id {cell_id!r}",
                tip="cell ids look like flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311 "
                "(aarch64 cells end in -aarch64); 'factory matrix' lists them",
            )
        cu = m.group("cu")
        cell = cls(
            package=m.group("pkg"),
            version=m.group("ver"),
            torch=m.group("torch"),
            cuda=f"{cu[:2]}.{cu[2:]}" if len(cu) >= 3 else f"{cu[0]}.{cu[1]}",
            archs=tuple(int(a[2:]) for a in m.group("archs").split("+")),
            python=f"3.{m.group('py')}",
            platform=m.group("plat") or DEFAULT_PLATFORM,
        )
        try:
            cell.check_plausible()
        except CellError as exc:
            raise CellError(f"cell id {cell_id!r}: {exc.message}") from None
        return cell

    def check_plausible(self) -> None:
        """Refuse what no build can be (CellError): a Python torch was never built for
        ('cp31' is 3.1), a CUDA that does not exist ('cu13' reads as 1.3), an sm no GPU has."""
        py = int(self.python.split(".")[1])
        if py not in PYTHON_MINORS:
            raise CellError(f"Python {self.python} is not one a wheel is built for here (3."
                            f"{PYTHON_MINORS[0]} to 3.{PYTHON_MINORS[-1]}: cp311, cp312, ...)")
        major, minor = self.cuda_tuple
        if major not in CUDA_MAJORS or minor > 9:
            raise CellError(f"CUDA {self.cuda} does not exist for torch (CUDA "
                            f"{CUDA_MAJORS[0]}.x to {CUDA_MAJORS[-1]}.x: cu126, cu128, cu130, "
                            "...)")
        unknown = [a for a in self.archs if a not in KNOWN_SMS]
        if unknown:
            raise CellError(f"sm_{unknown[0]} is no GPU's compute capability (e.g. sm_90 H100, "
                            "sm_100 B200, sm_120 RTX PRO 6000)")

    def content_key(self, recipe_revision: str, *, manylinux: str | None = None) -> str:
        """``manylinux``: the promised glibc floor ("2_28"); a wheel for another floor is
        another build. The platform is left out for x86_64 (keys from before the axis stay)."""
        values: dict[str, object] = {**self.as_dict(), "recipe_revision": recipe_revision}
        if self.platform == DEFAULT_PLATFORM:
            del values["platform"]
        if manylinux is not None:
            values["manylinux"] = manylinux
        payload = json.dumps(values, sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:16]

    def as_dict(self) -> dict[str, object]:
        return {
            "package": self.package,
            "version": self.version,
            "torch": self.torch,
            "cuda": self.cuda,
            "archs": list(self.archs),
            "python": self.python,
            "platform": self.platform,
        }
