"""Which CUDA a torch wheel is built for, from its core metadata: PyPI's CUDA builds depend on
NVIDIA's runtime packages, pinned to the CUDA release torch was built with.

Seen on PyPI: torch 2.7-2.10 pin ``nvidia-cuda-runtime-cu12==12.x.y`` for Linux x86_64 only
(their aarch64 wheels there are CPU builds); torch >= 2.11 pins ``cuda-toolkit[...]==X.Y.Z``
for Linux on every CPU. Markers are evaluated for the CPU and Python asked about.
"""

from __future__ import annotations

import dataclasses
import email.parser
import re

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# The requirement that names the CUDA release, most telling first.
_CUDA_PACKAGES = ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc")
_SUFFIX = re.compile(r"-cu\d+$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaPin:
    cuda: str  # "13.0"
    release: str  # the pinned version: "13.0.3" (cuda-toolkit) or "12.8.90" (the runtime's)
    requirement: str  # the requirement it came from, without extras and marker


def requirements(metadata: bytes) -> list[str]:
    msg = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
    return [str(v) for v in msg.get_all("Requires-Dist") or []]


def cuda_pin(metadata: bytes, *, platform: str, python: str) -> CudaPin | None:
    """The CUDA the wheel's requirements pin on Linux ``platform`` under CPython ``python``;
    None for a CPU build (no CUDA requirement applies there)."""
    env = {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
           "platform_machine": platform, "python_version": python,
           "python_full_version": f"{python}.0", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    found: dict[str, CudaPin] = {}
    for line in requirements(metadata):
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        base = _SUFFIX.sub("", canonicalize_name(req.name))
        if base not in _CUDA_PACKAGES or base in found:
            continue
        try:
            if req.marker is not None and not req.marker.evaluate(env):
                continue
        except UndefinedEnvironmentName:
            continue
        version = _lower_bound(req)
        m = re.match(r"(\d+)\.(\d+)", version or "")
        if m:
            bare = f"{req.name}{req.specifier}"
            found[base] = CudaPin(cuda=f"{int(m.group(1))}.{int(m.group(2))}",
                                  release=version or "", requirement=bare)
    for name in _CUDA_PACKAGES:
        if name in found:
            return found[name]
    return None


def _lower_bound(req: Requirement) -> str | None:
    for spec in req.specifier:
        if spec.operator in ("==", "===", ">=", "~=") and "*" not in spec.version:
            return spec.version
    return None
