"""The manylinux names: auditwheel's policies, a glibc floor as matrix.toml writes it ("2_28"),
the platform tags a wheel carries, the tag a builder image gives its wheels and this host's glibc.

One home for what the matrix (a floor setting), the toolchain (the sysroot's floor plan), the
wheel checks and the hosts' side all read."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import os
import platform
import re

from factory.errors import WheelError

_MANYLINUX_RE = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    name: str  # 'manylinux_2_28'
    glibc: tuple[int, int]
    versions: frozenset[str]  # 'GLIBC_2.28', 'GLIBCXX_3.4.24', ...
    families: frozenset[str]  # the families the policy constrains: 'GLIBC', 'GLIBCXX', ...


@functools.cache
def policies(arch: str = "x86_64") -> tuple[Policy, ...]:
    """auditwheel's manylinux policies for ``arch``, lowest glibc first."""
    try:
        data = importlib.resources.files("auditwheel.policy") / "manylinux-policy.json"
        text = data.read_text()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise WheelError(f"auditwheel's policy data is missing: {exc}",
                         tip="pip install 'auditwheel>=6.1'") from None
    out = []
    for raw in json.loads(text):
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)", raw["name"])
        table = raw.get("symbol_versions", {}).get(arch)
        if not m or table is None:
            continue
        out.append(Policy(
            name=raw["name"],
            glibc=(int(m.group(1)), int(m.group(2))),
            versions=frozenset(f"{fam}_{v}" for fam, vs in table.items() for v in vs),
            families=frozenset(table),
        ))
    return tuple(sorted(out, key=lambda p: p.glibc))


def glibc_text(glibc: tuple[int, int]) -> str:
    """(2, 31) -> '2.31'."""
    return f"{glibc[0]}.{glibc[1]}"


def manylinux_name(glibc: tuple[int, int]) -> str:
    """(2, 28) -> 'manylinux_2_28'."""
    return f"manylinux_{glibc[0]}_{glibc[1]}"


def parse_manylinux(platform_tag: str) -> tuple[tuple[int, int] | None, str]:
    """'manylinux_2_28_x86_64' -> ((2, 28), 'x86_64'); the legacy aliases too; else (None, tag)."""
    m = _MANYLINUX_RE.fullmatch(platform_tag)
    if m:
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    m = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", platform_tag)
    if m:
        return _LEGACY[m.group(1)], m.group(2)
    return None, platform_tag


def parse_floor(text: str) -> tuple[int, int]:
    """'2_28', '2.28' or 'manylinux_2_28' -> (2, 28); WheelError otherwise."""
    m = re.fullmatch(r"(?:manylinux_)?(\d+)[._](\d+)", text.strip())
    if not m:
        raise WheelError(f"{text!r} is not a glibc floor (write it like \"2_28\")")
    return int(m.group(1)), int(m.group(2))


def floor_policy(text: str, arch: str = "x86_64") -> Policy:
    """The manylinux policy a floor names ('2_28'); WheelError for one auditwheel lacks."""
    glibc = parse_floor(text)
    for policy in policies(arch):
        if policy.glibc == glibc:
            return policy
    known = ", ".join(p.name.removeprefix("manylinux_") for p in policies(arch))
    raise WheelError(f"no manylinux policy for glibc {glibc[0]}.{glibc[1]} (known: {known})")


# The manylinux tag follows the glibc of the build image (auditwheel refuses anything lower).
IMAGE_PLATS = {
    "factory-base:bookworm": "manylinux_2_36_x86_64",  # Debian 12, glibc 2.36 (tests, offline)
    "factory-base:trixie": "manylinux_2_41_x86_64",  # Debian 13, glibc 2.41 (Python 3.13)
    "quay.io/pypa/manylinux_2_28_x86_64": "manylinux_2_28_x86_64",
}


def plat_for_image(image: str) -> str:
    for prefix, plat in IMAGE_PLATS.items():
        if image.startswith(prefix):
            return plat
    if "manylinux_2_28" in image or "manylinux2_28" in image:
        return "manylinux_2_28_x86_64"
    return "manylinux_2_36_x86_64"


def host_glibc() -> tuple[int, int] | None:
    """This host's glibc (2, 36); None on a host without one (musl)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        text = ""
    if not text:
        lib, ver = platform.libc_ver()
        text = f"{lib} {ver}" if lib == "glibc" else ""
    m = re.search(r"glibc (\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None
