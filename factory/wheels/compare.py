"""Two builds of one wheel, compared member by member (``factory rebuild-check``): which members
differ, and why, as far as the bytes tell (zip times or modes only, RECORD following other
members, or which ELF sections of a shared object differ)."""

from __future__ import annotations

import dataclasses
import io
import zipfile
from pathlib import Path

from factory.errors import WheelError
from factory.wheels.reader import open_wheel

# What a differing ELF section usually means (the sections a torch CUDA extension holds).
_SECTION_REASONS = {
    ".nv_fatbin": "the CUDA fatbinary (nvcc's device code) differs",
    "__nv_relfatbin": "the relocatable CUDA fatbinary differs",
    ".nvFatBinSegment": "the fatbinary wrapper differs",
    ".note.gnu.build-id": "the build id (a hash of the other sections) differs",
    ".comment": "the compiler version strings differ",
    ".strtab": "local symbol names differ (nvcc's temporary file names carry its process id; "
    "repair makes them constant, so this means a wheel repaired before that)",
    ".dynstr": "the dynamic symbol names or the RPATH (set by repair) differ",
    ".dynamic": "the dynamic section (RPATH, needed libraries) differs",
    ".gnu_debuglink": "the debug link differs",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemberDiff:
    name: str
    why: str


def _elf_sections(data: bytes) -> dict[str, bytes] | None:
    if not data.startswith(b"\x7fELF"):
        return None
    # heavy: pyelftools, imported when ELF files are read
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(data))
        return {s.name: s.data() for s in elf.iter_sections() if s.header.sh_type != "SHT_NOBITS"}
    except (ELFError, ValueError):
        return None


def _why_content(a: bytes, b: bytes) -> str:
    sa, sb = _elf_sections(a), _elf_sections(b)
    if sa is None or sb is None:
        return f"content differs ({len(a)} vs {len(b)} bytes)"
    names = sorted(set(sa) | set(sb))
    differing = [n for n in names if sa.get(n) != sb.get(n)]
    if not differing:
        return "ELF headers or layout differ (every section's bytes are equal)"
    reasons = [_SECTION_REASONS.get(n) for n in differing]
    if any(n.startswith(".debug") for n in differing):
        reasons.append("debug info differs (it records build paths and times)")
    known = "; ".join(dict.fromkeys(r for r in reasons if r))
    return f"ELF sections {', '.join(differing)} differ" + (f": {known}" if known else "")


def compare_wheels(a: Path, b: Path) -> tuple[MemberDiff, ...]:
    """The members of wheels ``a`` and ``b`` that differ, in ``a``'s order; () if identical."""
    try:
        with open_wheel(a, a.name) as za, open_wheel(b, b.name) as zb:
            ia = {i.filename: i for i in za.infolist()}
            ib = {i.filename: i for i in zb.infolist()}
            out: list[MemberDiff] = []
            for name in [*ia, *(n for n in ib if n not in ia)]:
                if name not in ib:
                    out.append(MemberDiff(name=name, why="only in the first wheel"))
                    continue
                if name not in ia:
                    out.append(MemberDiff(name=name, why="only in the second wheel"))
                    continue
                x, y = ia[name], ib[name]
                da, db = za.read(x), zb.read(y)
                if da != db:
                    why = _why_content(da, db)
                    if name.endswith(".dist-info/RECORD"):
                        why = "RECORD lists the hashes of the members that differ"
                    out.append(MemberDiff(name=name, why=why))
                elif x.date_time != y.date_time:
                    out.append(
                        MemberDiff(
                            name=name,
                            why=f"zip time {x.date_time} vs {y.date_time} "
                            "(SOURCE_DATE_EPOCH not applied)",
                        )
                    )
                elif x.external_attr != y.external_attr:
                    out.append(MemberDiff(name=name, why="file mode differs"))
            if not out and [*ia] != [*ib]:
                out.append(MemberDiff(name="(archive)", why="the members are in another order"))
            if not out and a.read_bytes() != b.read_bytes():
                out.append(MemberDiff(name="(archive)", why="compression or zip headers differ"))
            return tuple(out)
    except (zipfile.BadZipFile, OSError) as exc:
        raise WheelError(f"cannot compare {a.name} with {b.name}: {exc}") from None
