"""A tiny fake of NVIDIA's CUDA redist tree: the manifest redistrib_X.Y.Z.json and one .tar.xz
per component under <component>/linux-x86_64/, each with NVIDIA's top directory layout."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from factory.toolchain import redist

NVCC = "#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n"


def _archive(component: str, version: str) -> bytes:
    """A tar.xz with NVIDIA's layout: one top dir <component>-linux-x86_64-<version>-archive."""
    top = f"{component}-linux-x86_64-{version}-archive"
    files = {f"{top}/include/{component}.h": b"/* header */\n", f"{top}/LICENSE": b"license\n"}
    if component == "cuda_nvcc":
        files[f"{top}/bin/nvcc"] = NVCC.encode()
        files[f"{top}/nvvm/bin/cicc"] = b"cicc\n"
    if component == "cuda_cudart":
        files[f"{top}/lib/libcudart.so.12"] = b"\x7fELF fake\n"
    if component.startswith("lib"):
        files[f"{top}/lib/{component}.so.12"] = b"big library, not wanted\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if "/bin/" in name else 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_mirror(
    root: Path,
    label: str = "12.8.1",
    *,
    corrupt: str | None = None,
    drop: str | None = None,
    platforms: tuple[str, ...] = ("linux-x86_64",),
) -> Path:
    manifest: dict[str, Any] = {"release_label": label, "release_product": "cuda"}
    for component in (*redist.COMPONENTS, *redist.HEADER_ONLY):
        if component == drop:
            continue
        version = "12.8.93"
        manifest[component] = {"name": component, "version": version}
        for plat in platforms:
            rel = f"{component}/{plat}/{component}-{plat}-{version}-archive.tar.xz"
            data = _archive(component, version)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data + (b"x" if component == corrupt else b""))
            manifest[component][plat] = {
                "relative_path": rel,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": str(len(data)),
            }
    (root / f"redistrib_{label}.json").write_text(json.dumps(manifest))
    return root
