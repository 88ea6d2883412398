"""Strict checks a wheel must pass before it is published (``factory publish`` and uploads).

Check, then change: everything here reads, nothing writes. In order, so that the cheap checks
refuse a hostile file before an expensive one touches it:

1. the filename: a wheel name with valid PEP 425 tags and known platform names, short enough;
2. the zip directory only (no decompression): member names (no NUL, absolute path, ``..``,
   backslash or drive), no duplicates, no symlinks, no encrypted members, only stored or
   deflated members, and the declared decompressed size and ratio under the limits (zipfile
   never inflates past a member's declared size, so the declared sizes bound the real work);
3. the contents: RECORD lists every file with a matching sha256 (or stronger) hash, METADATA
   is valid core metadata (``packaging.metadata``: a valid Requires-Python, single-valued
   fields given once), its name and version are the filename's, and WHEEL's tags are the
   filename's;
4. what pip itself refuses to install (pip/_internal/utils/wheel.py, ``parse_wheel``): a
   ``.dist-info`` directory whose canonical name does not start with the project's, and a
   WHEEL without a ``Wheel-Version`` of dot-separated numbers or with a major version above 1.

Every refusal is a ``WheelError`` with one line saying why.
"""

from __future__ import annotations

import dataclasses
import re
import stat
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.metadata import Metadata
from packaging.tags import Tag
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from factory.errors import WheelError
from factory.units import GIB, MIB
from factory.wheels.reader import WheelInfo, analyse_wheel, open_wheel

MAX_FILENAME = 200  # real ones stay under ~120 even with compressed manylinux tag sets
_ARCHS = r"(x86_64|i686|aarch64|armv7l|ppc64le|ppc64|s390x|riscv64|loongarch64)"
_PLATFORM_RE = re.compile(
    r"^(any"
    rf"|linux_{_ARCHS}"
    r"|manylinux1_(x86_64|i686)|manylinux2010_(x86_64|i686)"
    rf"|manylinux2014_{_ARCHS}"
    rf"|(manylinux|musllinux)_\d+_\d+_{_ARCHS}"
    r"|macosx_\d+_\d+_(arm64|x86_64|universal2|intel|fat|fat3|fat64|universal|i386|ppc|ppc64)"
    r"|win32|win_amd64|win_arm64|win_ia64"
    r"|android_\d+_(arm64_v8a|armeabi_v7a|x86_64|x86)"
    r"|ios_\d+_\d+_(arm64|x86_64)_(iphoneos|iphonesimulator))$"
)
_INTERPRETER_RE = re.compile(r"^(py|cp|pp|ip|jy|graalpy)\d+$")
_ABI_RE = re.compile(r"^(none|abi3|(cp|pp|ip|jy)\d+[dmut]*|pypy\d+_pp\d+|graalpy\d+(_[a-z0-9]+)*)$")
_ALLOWED_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
_METHOD_NAMES = {12: "bzip2", 14: "lzma", 93: "zstd", 95: "xz", 99: "AES-encrypted"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelLimits:
    """How big a wheel may unpack. CUDA wheels are big (a 60 MB flash-attn wheel holds a 222 MB
    library; torch's unpacks to a few GB), but nothing real compresses 100:1 at that size."""

    max_unpacked: int = 16 * GIB
    max_ratio: float = 100.0  # decompressed / compressed, for the whole wheel
    ratio_from: int = 256 * MIB  # small wheels of text may compress better; not worth refusing
    max_members: int = 200_000


DEFAULT_LIMITS = WheelLimits()


def _invalid_tag(tag: Tag) -> str | None:
    if not _INTERPRETER_RE.match(tag.interpreter):
        return f"interpreter tag {tag.interpreter!r}"
    if not _ABI_RE.match(tag.abi):
        return f"ABI tag {tag.abi!r}"
    if not _PLATFORM_RE.match(tag.platform):
        return f"platform tag {tag.platform!r}"
    return None


def check_filename(name: str) -> tuple[NormalizedName, Version, frozenset[Tag]]:
    """The filename alone, before anything is written under it."""
    shown = repr(name[:80])
    if "\0" in name or "/" in name or "\\" in name or name.startswith("."):
        raise WheelError(f"unsafe wheel filename {shown}")
    if len(name) > MAX_FILENAME:
        raise WheelError(f"wheel filename too long ({len(name)} > {MAX_FILENAME} characters)")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._+-]*\.whl", name):
        raise WheelError(f"invalid wheel filename {shown}: unexpected characters")
    try:
        dist, version, _, tags = parse_wheel_filename(name)
    except (InvalidWheelFilename, InvalidVersion, ValueError) as exc:
        raise WheelError(f"invalid wheel filename {shown}: {exc}") from None
    if not tags:
        raise WheelError(f"invalid wheel filename {shown}: no tags")
    for tag in sorted(tags, key=str):
        problem = _invalid_tag(tag)
        if problem:
            raise WheelError(f"{name}: invalid {problem} (PEP 425)")
    return dist, version, tags


def _unsafe_member(member: str) -> str | None:
    if "\0" in member:
        return "a NUL character"
    if member.startswith("/") or "\\" in member or re.match(r"^[A-Za-z]:", member):
        return "an absolute or Windows path"
    if ".." in member.split("/"):
        return "'..'"
    return None


def check_archive(zf: zipfile.ZipFile, name: str, limits: WheelLimits = DEFAULT_LIMITS) -> None:
    """The zip directory only: names, kinds, methods, flags and declared sizes."""
    infos = zf.infolist()
    if len(infos) > limits.max_members:
        raise WheelError(f"{name}: {len(infos)} members (more than {limits.max_members})")
    seen: set[str] = set()
    unpacked = packed = 0
    for info in infos:
        member = info.filename
        shown = repr(member[:80])
        problem = _unsafe_member(member) or _unsafe_member(info.orig_filename)
        if problem:
            raise WheelError(f"{name}: unsafe path in archive: {shown} ({problem})")
        if member in seen:
            raise WheelError(f"{name}: member {shown} is in the zip twice")
        seen.add(member)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise WheelError(f"{name}: member {shown} is a symlink")
        if info.flag_bits & 0x1:
            raise WheelError(f"{name}: member {shown} is encrypted")
        if info.compress_type not in _ALLOWED_METHODS:
            method = _METHOD_NAMES.get(info.compress_type, f"method {info.compress_type}")
            raise WheelError(f"{name}: member {shown} is compressed with {method}")
        unpacked += info.file_size
        packed += info.compress_size
        if unpacked > limits.max_unpacked:
            raise WheelError(
                f"{name}: unpacks to more than {limits.max_unpacked} bytes (the limit)"
            )
    if unpacked > limits.ratio_from and unpacked > limits.max_ratio * max(packed, 1):
        raise WheelError(
            f"{name}: unpacks {unpacked / max(packed, 1):.0f}x its compressed size "
            f"({unpacked} bytes; the limit is {limits.max_ratio:g}x): a zip bomb?"
        )


def _check_metadata(info: WheelInfo, text: bytes, project: str, version: Version) -> None:
    name = info.filename
    try:
        meta = Metadata.from_email(text, validate=True)
    except Exception as exc:  # packaging raises an ExceptionGroup of InvalidMetadata
        causes = getattr(exc, "exceptions", None) or [exc]
        raise WheelError(f"{name}: invalid METADATA: {causes[0]}") from None
    if canonicalize_name(meta.name) != project:
        raise WheelError(f"{name}: filename says {project!r} but METADATA says {meta.name!r}")
    if meta.version != version:
        raise WheelError(
            f"{name}: filename says version {version} but METADATA says {meta.version}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class VettedWheel:
    info: WheelInfo
    metadata: bytes  # the METADATA file as it is in the wheel (served as PEP 658 metadata)


def check_wheel(path: Path, limits: WheelLimits = DEFAULT_LIMITS) -> VettedWheel:
    """Every check above, cheapest first; returns what the wheel says about itself."""
    name = path.name
    project, version, tags = check_filename(name)
    try:
        with open_wheel(path, name) as zf:
            check_archive(zf, name, limits)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise WheelError(f"{name} is not a readable zip file: {exc}") from None
    info = analyse_wheel(path)  # one .dist-info with METADATA and WHEEL; RECORD re-hashed
    if info.record_problems:
        raise WheelError(f"{name}: RECORD: {info.record_problems[0]}")
    expected = tuple(sorted(str(t) for t in tags))
    if info.wheel_tags != expected:
        raise WheelError(
            f"{name}: the filename's tags ({', '.join(expected)}) are not WHEEL's "
            f"({', '.join(info.wheel_tags) or 'none'})"
        )
    try:
        with zipfile.ZipFile(path) as zf:
            metadata = zf.read(f"{info.dist_info}/METADATA")
            wheel_file = zf.read(f"{info.dist_info}/WHEEL")
    except (zipfile.BadZipFile, OSError, KeyError) as exc:
        raise WheelError(f"{name}: cannot read METADATA or WHEEL ({exc})") from None
    _check_metadata(info, metadata, project, version)
    check_pip_accepts(name, project, info.dist_info, wheel_file)
    return VettedWheel(info=info, metadata=metadata)


PIP_WHEEL_VERSION = (1, 0)  # pip's VERSION_COMPATIBLE: a higher major is refused


def check_pip_accepts(name: str, project: str, dist_info: str, wheel_file: bytes) -> None:
    """pip's own checks before it installs a wheel (``parse_wheel`` in pip's
    _internal/utils/wheel.py, the same in pip 20 to 26): the ``.dist-info`` directory's
    canonical name starts with the project's, and WHEEL's ``Wheel-Version`` is numbers whose
    major is not above 1. A wheel failing them is on the index for nobody."""
    if not canonicalize_name(dist_info).startswith(canonicalize_name(project)):
        raise WheelError(
            f"{name}: its .dist-info directory {dist_info[:80]!r} does not start with the "
            f"project name {project!r}: pip refuses to install it"
        )
    try:
        text = wheel_file.decode()
    except UnicodeDecodeError:
        raise WheelError(f"{name}: WHEEL is not UTF-8: pip refuses to install it") from None
    value = HeaderParser().parsestr(text)["Wheel-Version"]
    if value is None:
        raise WheelError(f"{name}: WHEEL has no Wheel-Version: pip refuses to install it")
    try:
        wheel_version = tuple(int(part) for part in str(value).strip().split("."))
    except ValueError:
        raise WheelError(
            f"{name}: invalid Wheel-Version {str(value).strip()[:40]!r}: pip refuses to install it"
        ) from None
    if wheel_version[0] > PIP_WHEEL_VERSION[0]:
        raise WheelError(
            f"{name}: Wheel-Version {str(value).strip()[:40]} is a major version pip does not "
            f"install (it installs {PIP_WHEEL_VERSION[0]}.x)"
        )
