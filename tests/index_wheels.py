"""Small, fake but valid wheels for the store/index/server tests and the index benchmarks."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path

from factory.index.publish import publish
from factory.store import Store


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_name(name: str, version: str, tag: str = "py3-none-any") -> str:
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-{tag}.whl"


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: Iterable[str] = (),
    requires_python: str | None = None,
    tag: str = "py3-none-any",
    payload_bytes: int = 0,
    metadata_name: str | None = None,
    metadata_version: str | None = None,
    extra_members: dict[str, bytes] | None = None,
    skip_record: bool = False,
    filename: str | None = None,
    wheel_version: str = "1.0",
    dist_info: str | None = None,
) -> Path:
    """Write a pure-python wheel; ``payload_bytes`` of random data make it as big as wanted.
    ``wheel_version`` and ``dist_info`` (the directory's name) make wheels pip refuses."""
    module = re.sub(r"[-_.]+", "_", name).lower()
    dist_info = dist_info or f"{module}-{version}.dist-info"
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {metadata_name or name}",
        f"Version: {metadata_version or version}",
    ]
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {r}" for r in requires]
    members: dict[str, bytes] = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{dist_info}/METADATA": ("\n".join(meta) + "\n\n").encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: {wheel_version}\nGenerator: tests\nRoot-Is-Purelib: true\n"
            f"Tag: {tag}\n"
        ).encode(),
    }
    if payload_bytes:
        members[f"{module}/payload.bin"] = os.urandom(payload_bytes)
    members.update(extra_members or {})
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in members.items())
    if not skip_record:
        members[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = Path(directory) / (filename or wheel_name(name, version, tag))
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            # Random payload does not compress: store it, so big wheels are quick to make.
            kind = zipfile.ZIP_STORED if member.endswith(".bin") else zipfile.ZIP_DEFLATED
            zf.writestr(member, data, compress_type=kind)
    return path


def variant_wheel(
    directory: Path,
    name: str,
    version: str,
    torch_minor: str,
    cuda: str = "13.0",
    archs: str = "",
    **kwargs: object,
) -> Path:
    """A wheel tagged and pinned like the factory's: ``1.0+cu130torch2.14``, ``torch==2.14.*``;
    ``archs`` ('100', '90.100') adds the arch marker of a non-default arch set."""
    maj, mnr = cuda.split(".")
    local = f"{version}+cu{maj}{mnr}torch{torch_minor}" + (f"sm{archs}" if archs else "")
    requires = [f"torch=={torch_minor}.*", *kwargs.pop("requires", ())]  # type: ignore[misc]
    return make_wheel(directory, name, local, requires=requires, **kwargs)  # type: ignore[arg-type]


def publish_demo(store: Store, tmp_path: Path) -> list[Path]:
    wheels = [
        variant_wheel(tmp_path, "Fa_Demo", "1.0.0", t, requires_python=">=3.8")
        for t in ("2.13", "2.14")
    ]
    wheels.append(make_wheel(tmp_path, "torch", "2.14.1"))
    publish(store, wheels)
    return wheels
