"""The glibc floor of a wheel: the lowest manylinux policy its binaries really fit.

Read from the binaries, not from the build image's name: every ELF file in the wheel lists the
symbol versions it needs from each system library (``.gnu.version_r``: ``GLIBC_2.29`` from
``libm.so.6``, ``GLIBCXX_3.4.26`` from ``libstdc++.so.6``). The lowest policy of auditwheel's
own policy data (``manylinux-policy.json``, shipped with auditwheel) that holds every needed
version is the floor, as ``auditwheel show`` reports it. The versions that the next lower policy
lacks, with the symbols that need them, are what set it: they are what to change for a lower one.
"""

from __future__ import annotations

import dataclasses
import io
import re
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from factory.errors import WheelError
from factory.matrix.manylinux import Policy, glibc_text, manylinux_name, parse_manylinux, policies
from factory.toolchain.sysroot import REACH

# The symbol-version families worth naming on their own in a report.
_FAMILIES = ("GLIBC", "GLIBCXX", "CXXABI")
_MAX_SYMBOLS = 4  # symbols named per version in a report


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.partition("_")[2]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class VersionNeed:
    """One symbol version one file needs from one system library."""

    version: str  # 'GLIBC_2.29'
    library: str  # 'libm.so.6'
    member: str  # the file, as named inside the wheel
    symbols: tuple[str, ...]  # the first few symbols that need it

    def describe(self) -> str:
        names = ", ".join(self.symbols[:2]) if self.symbols else "no named symbol"
        if len(self.symbols) > 2:
            names += ", ..."
        return f"{self.version} from {self.library} ({names}) in {self.member}"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"symbols": list(self.symbols)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BinaryFloor:
    """What a wheel's binaries need from the host's C and C++ runtime."""

    policy: str  # 'manylinux_2_28'; 'linux' when no manylinux policy fits; 'none' without ELF
    arch: str
    files: int  # ELF files read
    highest: dict[str, str]  # family -> highest version needed: {'GLIBC': 'GLIBC_2.27', ...}
    set_by: tuple[VersionNeed, ...]  # the needs that the next lower policy lacks

    @property
    def glibc(self) -> tuple[int, int] | None:
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)", self.policy)
        return (int(m.group(1)), int(m.group(2))) if m else None

    @property
    def platform(self) -> str:
        return f"{self.policy}_{self.arch}"

    def why(self) -> str:
        """One line: what sets the floor."""
        if self.policy == "none":
            return "no compiled code"
        if not self.set_by:
            return f"{self.policy}: nothing newer than the lowest policy is needed"
        first = self.set_by[0].describe()
        more = f" (+{len(self.set_by) - 1} more)" if len(self.set_by) > 1 else ""
        return f"{self.policy}, set by {first}{more}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "platform": self.platform,
            "glibc": None if self.glibc is None else glibc_text(self.glibc),
            "files": self.files,
            "highest": dict(sorted(self.highest.items())),
            "set_by": [n.as_dict() for n in self.set_by],
        }


def elf_needs(data: bytes, member: str) -> list[VersionNeed]:
    """The symbol versions one ELF file needs (from ``.gnu.version_r``), with their symbols."""
    # heavy: pyelftools, imported when ELF files are read
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection
    from elftools.elf.sections import SymbolTableSection

    try:
        elf = ELFFile(io.BytesIO(data))
        verneed = next((s for s in elf.iter_sections() if isinstance(s, GNUVerNeedSection)), None)
        if verneed is None:
            return []
        by_index: dict[int, tuple[str, str]] = {}
        for need, auxes in verneed.iter_versions():
            for aux in auxes:
                by_index[aux["vna_other"]] = (aux.name, need.name or "")
        symbols: dict[int, list[str]] = {}
        versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
        dynsym = elf.get_section_by_name(".dynsym")
        if versym is not None and isinstance(dynsym, SymbolTableSection):
            for i, sym in enumerate(dynsym.iter_symbols()):
                if sym["st_shndx"] != "SHN_UNDEF" or not sym.name:
                    continue
                ndx = versym.get_symbol(i)["ndx"]
                if isinstance(ndx, int) and ndx in by_index:
                    symbols.setdefault(ndx, []).append(sym.name)
    except (ELFError, ValueError, KeyError) as exc:
        raise WheelError(f"{member}: unreadable ELF file: {exc}") from None
    return [
        VersionNeed(version=version, library=library, member=member,
                    symbols=tuple(sorted(symbols.get(ndx, []))[:_MAX_SYMBOLS]))
        for ndx, (version, library) in sorted(by_index.items())
    ]


def _fits(policy: Policy, needs: Iterable[VersionNeed]) -> list[VersionNeed]:
    """The needs ``policy`` lacks (a family the policy does not constrain is not its business)."""
    return [n for n in needs
            if n.version.partition("_")[0] in policy.families and n.version not in policy.versions]


def floor_of(needs: Sequence[VersionNeed], *, files: int, arch: str = "x86_64") -> BinaryFloor:
    """The lowest policy that holds every need; ``set_by`` what the policy below it lacks."""
    highest: dict[str, str] = {}
    for n in needs:
        family = n.version.partition("_")[0]
        if family in _FAMILIES and (
            family not in highest or _version_key(n.version) > _version_key(highest[family])
        ):
            highest[family] = n.version
    if files == 0:
        return BinaryFloor(policy="none", arch=arch, files=0, highest={}, set_by=())
    below: Policy | None = None
    for policy in policies(arch):
        if not _fits(policy, needs):
            lacks = _fits(below, needs) if below else []
            lacks.sort(key=lambda n: (n.version.partition("_")[0] != "GLIBC",
                                      [-x for x in _version_key(n.version)], n.member))
            return BinaryFloor(policy=policy.name, arch=arch, files=files, highest=highest,
                               set_by=tuple(lacks))
        below = policy
    lacks = _fits(below, needs) if below else []
    return BinaryFloor(policy="linux", arch=arch, files=files, highest=highest, set_by=tuple(lacks))


def _is_elf(name: str, head: bytes) -> bool:
    return head[:4] == b"\x7fELF" and not name.endswith((".o", ".a"))


def files_floor(paths: Iterable[Path], *, arch: str = "x86_64") -> BinaryFloor:
    """The floor of loose binaries (a build tree's ``.so`` files)."""
    needs: list[VersionNeed] = []
    files = 0
    for path in paths:
        data = Path(path).read_bytes()
        if _is_elf(path.name, data):
            files += 1
            needs += elf_needs(data, path.name)
    return floor_of(needs, files=files, arch=arch)


def wheel_floor(wheel: Path, data: bytes | None = None) -> BinaryFloor:
    """The floor of every ELF file in ``wheel`` (its own and any that auditwheel grafted);
    ``data``: the wheel's bytes, when they are not in a file (a store object)."""
    _, arch = _wheel_arch(Path(wheel).name)
    needs: list[VersionNeed] = []
    files = 0
    try:
        with zipfile.ZipFile(io.BytesIO(data) if data is not None else wheel) as zf:
            for item in zf.infolist():
                if item.is_dir():
                    continue
                with zf.open(item) as fh:
                    head = fh.read(4)
                if not _is_elf(item.filename, head):
                    continue
                files += 1
                needs += elf_needs(zf.read(item), item.filename)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{Path(wheel).name}: cannot read: {exc}") from None
    return floor_of(needs, files=files, arch=arch)


def _wheel_arch(filename: str) -> tuple[tuple[int, int] | None, str]:
    plats = filename[: -len(".whl")].split("-")[-1].split(".") if filename.endswith(".whl") else []
    promised = [parse_manylinux(p) for p in plats]
    glibcs = [g for g, _ in promised if g is not None]
    arch = next((a for g, a in promised if g is not None), "x86_64")
    return (min(glibcs) if glibcs else None), arch


def promised_glibc(filename: str) -> tuple[int, int] | None:
    """The lowest glibc a wheel's platform tags promise to run on (None: not manylinux)."""
    return _wheel_arch(filename)[0]


def lower_floor_tip(reached: BinaryFloor, plan: Any) -> str | None:
    """One line on how to get a lower floor than ``reached`` (``plan``: the build's
    ``toolchain.sysroot.FloorPlan``), or None when it is already torch's own."""
    glibc = reached.glibc
    if glibc is None or glibc <= REACH:
        return None
    lowest = manylinux_name(REACH)
    if not plan.sysroot:
        return (f"for a lower floor: build with manylinux = \"{REACH[0]}_{REACH[1]}\" and the "
                f"factory's glibc 2.31 sysroot (sysroot = \"bullseye\", 'factory image sysroot'; "
                f"the local runner uses it too), which reaches {lowest}")
    return (f"for a lower floor: the symbols that set it ({reached.why()}) come from the source; "
            f"the sysroot's glibc 2.31 reaches {lowest} only without them")
