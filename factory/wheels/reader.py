"""Reading a wheel: its filename, its one ``.dist-info``, WHEEL, METADATA and RECORD.

The primitives (``parse_filename``, ``open_wheel``, ``dist_info_dir``, ``read_metadata``,
``parse_headers``) are shared by every reader of wheels: ``analyse_wheel`` reads a built wheel
into a frozen ``WheelInfo`` (finalize and verify compare it with the plan), and the index's
publish checks a wheel with them before it stores it.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import re
import zipfile
from collections.abc import Iterable
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.errors import WheelError

# Signatures over RECORD: not listed in it, and void once RECORD is rewritten.
SIGNATURE_FILES = frozenset({"RECORD.jws", "RECORD.p7s"})
MAX_METADATA = 16 * 1024 * 1024  # a METADATA larger than this is not one
_SO_RE = re.compile(r"\.so(\.\d+)*$")


# -- the primitives -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelName:
    """What a wheel's filename says (PEP 427)."""

    distribution: NormalizedName  # canonical project name
    version: Version
    tags: frozenset[Tag]


def parse_filename(filename: str) -> WheelName:
    try:
        dist, version, _, tags = parse_wheel_filename(filename)
    except ValueError:  # InvalidWheelFilename, InvalidVersion
        raise WheelError(f"invalid wheel filename {filename[:80]!r}") from None
    return WheelName(distribution=canonicalize_name(dist), version=version, tags=tags)


def require_file(path: Path) -> Path:
    """``path`` when it is a file; else the one-line WheelError a missing input gets."""
    try:
        is_file = path.is_file()
    except OSError as exc:  # a name longer than the filesystem allows, a loop of links
        raise WheelError(f"{str(path)[:120]}: {exc.strerror}") from None
    if not is_file:
        raise WheelError(f"{str(path)[:120]}: no such file")
    return path


def open_wheel(source: Path | bytes, name: str) -> zipfile.ZipFile:
    """The wheel's archive, from a file or from bytes; ``name`` is its filename for errors."""
    try:
        return zipfile.ZipFile(source if isinstance(source, Path) else io.BytesIO(source))
    except FileNotFoundError:
        raise WheelError(f"wheel {name if isinstance(source, bytes) else source} does not exist"
                         ) from None
    except OSError as exc:
        raise WheelError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except zipfile.BadZipFile as exc:
        raise WheelError(f"{name} is not a readable zip file: {exc}") from None


def is_shared_object(member: str) -> bool:
    """Whether an archive member is a shared object (``_C.so``, ``libx.so.12``)."""
    return _SO_RE.search(member) is not None


def dist_info_dir(members: Iterable[str], name: str) -> str:
    """The one top-level ``.dist-info`` directory among the archive's members."""
    tops = {m.split("/", 1)[0] for m in members}
    found = sorted(t for t in tops if t.endswith(".dist-info"))
    if len(found) != 1:
        raise WheelError(f"{name}: expected one .dist-info directory, found {len(found) or 'none'}")
    return found[0]


def read_member(zf: zipfile.ZipFile, member: str, name: str) -> bytes:
    try:
        return zf.read(member)
    except KeyError:
        raise WheelError(f"{name}: {member} is missing") from None


def read_metadata(zf: zipfile.ZipFile, dist_info: str, name: str) -> bytes:
    """METADATA's bytes, as the index serves them (PEP 658)."""
    member = f"{dist_info}/METADATA"
    try:
        size = zf.getinfo(member).file_size
    except KeyError:
        raise WheelError(f"{name}: {member} is missing") from None
    if size > MAX_METADATA:
        raise WheelError(f"{name}: METADATA is implausibly large")
    return read_member(zf, member, name)


def parse_headers(data: bytes, what: str, name: str) -> Message:
    """The header fields of METADATA or WHEEL (RFC 822 style; UTF-8 by the core metadata spec)."""
    try:
        return HeaderParser().parsestr(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise WheelError(f"{name}: {what} is not UTF-8") from None


# -- what a wheel says about itself ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelInfo:
    """What a wheel says about itself: filename, WHEEL, METADATA, RECORD and its files."""

    path: Path
    filename: str
    filename_name: str  # canonical project name from the filename
    filename_version: str
    tags: tuple[str, ...]  # from the filename, sorted: 'cp311-cp311-manylinux_2_36_x86_64'
    wheel_tags: tuple[str, ...]  # the Tag lines of WHEEL, sorted
    dist_info: str  # 'flash_attn-2.8.3+cu130torch2.14.dist-info'
    name: str  # METADATA Name, as written
    version: str  # METADATA Version, as written
    metadata_version: str
    requires_dist: tuple[str, ...]
    requires_python: str | None
    top_level: tuple[str, ...]  # importable top-level modules and packages
    extensions: tuple[str, ...]  # shared objects (.so, .so.N) inside the wheel
    record_problems: tuple[str, ...]  # empty when RECORD lists every file with its hash

    @property
    def record_ok(self) -> bool:
        return not self.record_problems

    @property
    def local(self) -> str | None:
        return Version(self.version).local

    @property
    def public_version(self) -> str:
        return Version(self.version).public

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(sorted({t.rsplit("-", 1)[-1] for t in self.tags}))

    @property
    def interpreters(self) -> tuple[str, ...]:
        return tuple(sorted({t.split("-", 1)[0] for t in self.tags}))

    def torch_requirements(self) -> tuple[Requirement, ...]:
        """Requires-Dist entries on torch that apply to every install (not behind an extra)."""
        out = []
        for text in self.requires_dist:
            req = parse_requirement(text)
            if (
                req is not None
                and canonicalize_name(req.name) == "torch"
                and not behind_extra(req)
            ):
                out.append(req)
        return tuple(out)


def parse_requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def behind_extra(req: Requirement) -> bool:
    return req.marker is not None and "extra" in str(req.marker)


# -- analysis --------------------------------------------------------------------------------------
def analyse_wheel(path: Path) -> WheelInfo:
    """Read a wheel without changing it. Raises WheelError when it is not a readable wheel."""
    path = Path(path)
    name = parse_filename(path.name)
    with open_wheel(path, path.name) as zf:
        files = [i for i in zf.infolist() if not i.is_dir()]
        names = [i.filename for i in files]
        dist_info = dist_info_dir(zf.namelist(), path.name)
        meta = parse_headers(read_metadata(zf, dist_info, path.name), "METADATA", path.name)
        wheel_meta = parse_headers(
            read_member(zf, f"{dist_info}/WHEEL", path.name), "WHEEL", path.name
        )
        if not meta.get("Name") or not meta.get("Version"):
            raise WheelError(f"{path.name}: METADATA lacks Name or Version")
        try:
            Version(str(meta["Version"]).strip())
        except (InvalidVersion, ValueError):  # ValueError: a number longer than int() accepts
            raise WheelError(
                f"{path.name}: METADATA Version {str(meta['Version'])[:80]!r} is not PEP 440"
            ) from None
        try:
            record_problems = _check_record(zf, files, dist_info)
        except (zipfile.BadZipFile, OSError) as exc:  # a corrupt member (bad CRC, truncated)
            raise WheelError(f"{path.name}: cannot read its files: {exc}") from None
    return WheelInfo(
        path=path,
        filename=path.name,
        filename_name=name.distribution,
        filename_version=str(name.version),
        tags=tuple(sorted(str(t) for t in name.tags)),
        wheel_tags=tuple(sorted(wheel_meta.get_all("Tag") or ())),
        dist_info=dist_info,
        name=str(meta["Name"]).strip(),
        version=str(meta["Version"]).strip(),
        metadata_version=str(meta.get("Metadata-Version", "")).strip(),
        requires_dist=tuple(str(r).strip() for r in meta.get_all("Requires-Dist") or ()),
        requires_python=(
            str(meta["Requires-Python"]).strip() if meta.get("Requires-Python") else None
        ),
        top_level=_top_level(names, dist_info),
        extensions=tuple(sorted(n for n in names if _SO_RE.search(n))),
        record_problems=tuple(record_problems),
    )


def _top_level(names: Iterable[str], dist_info: str) -> tuple[str, ...]:
    """Top-level importable names, from the files themselves (top_level.txt is optional and
    setuptools-only). auditwheel's '<pkg>.libs' folders are not importable."""
    data_dir = dist_info[: -len(".dist-info")] + ".data"
    out: set[str] = set()
    for n in names:
        parts = PurePosixPath(n).parts
        if parts[0] == dist_info:
            continue
        if parts[0] == data_dir:
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue
            parts = parts[2:]
        first = parts[0]
        if len(parts) > 1:
            candidate = first
        elif first.endswith(".py"):
            candidate = first[:-3]
        elif _SO_RE.search(first):
            candidate = first.split(".", 1)[0]
        else:
            continue
        if candidate.isidentifier() and candidate != "__pycache__":
            out.add(candidate)
    return tuple(sorted(out))


def _check_record(zf: zipfile.ZipFile, files: list[zipfile.ZipInfo], dist_info: str) -> list[str]:
    record_name = f"{dist_info}/RECORD"
    try:
        text = zf.read(record_name).decode("utf-8")
    except KeyError:
        return ["RECORD is missing"]
    except UnicodeDecodeError:
        return ["RECORD is not UTF-8"]
    problems: list[str] = []
    listed: dict[str, tuple[str, str]] = {}
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:  # e.g. a newline inside an unquoted file name
        return [f"RECORD is not valid CSV: {exc}"]
    for row in rows:
        if not row:
            continue
        if len(row) != 3:
            problems.append(f"RECORD row {row!r} does not have 3 fields")
            continue
        listed[row[0]] = (row[1], row[2])
    exempt = {record_name} | {f"{dist_info}/{s}" for s in SIGNATURE_FILES}
    for info in files:
        if info.filename in exempt:
            continue
        entry = listed.pop(info.filename, None)
        if entry is None:
            problems.append(f"{info.filename} is not in RECORD")
            continue
        hash_spec, size = entry
        algo, _, expected = hash_spec.partition("=")
        if algo not in ("sha256", "sha384", "sha512"):
            problems.append(
                f"{info.filename}: RECORD hash {algo or 'missing'!r} is not sha256 or stronger"
            )
            continue
        h = hashlib.new(algo)
        with zf.open(info) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode() != expected:
            problems.append(f"{info.filename}: hash differs from RECORD")
        if size and size != str(info.file_size):
            problems.append(f"{info.filename}: size {info.file_size} differs from RECORD ({size})")
    listed.pop(record_name, None)
    for extra in sorted(listed):
        if extra not in exempt:
            problems.append(f"RECORD lists {extra}, which is not in the wheel")
    return problems
