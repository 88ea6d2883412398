"""A CUDA 12.x toolkit from NVIDIA's redistributable archives, and the builder image that
carries it (``factory image cuda 12.8``).

The CUDA 12.x PyPI wheels hold only ptxas, libnvvm and headers (no nvcc driver, cicc, cudafe++,
fatbinary, nvlink), so a 12.x toolkit comes from NVIDIA's redist tree: a manifest
``redistrib_<X.Y.Z>.json`` naming, per component and platform, a ``relative_path`` to a
``.tar.xz`` archive with its sha256. The tree is read from the network (``REDIST_URL``) or from
a local mirror directory with the same layout (an offline builder copies it there). Every
archive is checked against the manifest's sha256 before it is unpacked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from packaging.version import InvalidVersion, Version

from factory.engine import docker_client
from factory.errors import ToolchainError
from factory.tarsafe import extract
from factory.toolchain.cross import CPU_PLATFORMS, builder_platform
from factory.toolchain.download import read_with_progress
from factory.toolchain.images import image_progress
from factory.toolchain.toolkit import HEADER_EXTRAS, STAMP

_log = logging.getLogger(__name__)

REDIST_URL = "https://developer.download.nvidia.com/compute/cuda/redist/"
# What torch's extension builder needs: nvcc (with cicc, ptxas, crt, nvvm, fatbinary, nvlink),
# the runtime, CCCL (cuda_fp16.h needs <nv/target>), NVRTC and NVTX headers torch includes, and,
# header-only, the math libraries ATen/cuda/CUDAContext.h includes.
COMPONENTS = (
    "cuda_nvcc",
    "cuda_cudart",
    "cuda_cccl",
    "cuda_nvrtc",
    "cuda_nvtx",
    "cuda_profiler_api",
)
HEADER_ONLY = tuple(f"lib{name}" for name in HEADER_EXTRAS)
_MANIFEST_RE = re.compile(r"redistrib_(\d+\.\d+\.\d+)\.json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Archive:
    component: str
    version: str
    relative_path: str
    sha256: str
    headers_only: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Release:
    label: str  # "12.8.1"
    source: str  # the mirror dir or URL the manifest came from
    archives: tuple[Archive, ...]


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://", "file://"))


def _get(url: str, *, timeout: float = 60, progress: bool = False) -> bytes:
    """The body at ``url``; with ``progress`` (an archive) read in chunks behind a progress
    line."""
    request = urllib.request.Request(url, headers={"User-Agent": "cuda-wheel-factory"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            if progress:
                return read_with_progress(resp, url.rsplit("/", 1)[-1])
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        raise ToolchainError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ToolchainError(
            f"cannot reach {url}: {getattr(exc, 'reason', exc)}",
            tip="offline: mirror NVIDIA's redist tree into a directory and pass --from DIR",
        ) from None


def _read(source: str, relative: str, *, progress: bool = False) -> bytes:
    if _is_url(source):
        return _get(urllib.parse.urljoin(source.rstrip("/") + "/", relative), progress=progress)
    path = Path(source) / relative
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ToolchainError(f"cannot read {path}: {exc.strerror}") from None


def _manifest_labels(source: str) -> list[str]:
    if _is_url(source):
        listing = _get(source.rstrip("/") + "/", timeout=30).decode("utf-8", "replace")
        names = set(_MANIFEST_RE.findall(listing))
    else:
        if not Path(source).is_dir():
            raise ToolchainError(f"redist mirror {source} is not a directory")
        names = {
            m.group(1) for p in Path(source).iterdir() if (m := _MANIFEST_RE.fullmatch(p.name))
        }
    return sorted(names, key=Version)


def find_release(cuda: str, source: str = REDIST_URL, *, builder: str | None = None) -> Release:
    """The newest ``redistrib_<cuda>.*.json`` in ``source`` (a URL or a mirror dir), parsed, with
    the archives for the ``builder``'s CPU (default: this machine's)."""
    platform = CPU_PLATFORMS[builder or builder_platform()].cuda_redist
    try:
        want = Version(cuda).release[:2]
    except InvalidVersion:
        raise ToolchainError(f"CUDA version {cuda!r} is not MAJOR.MINOR (e.g. 12.8)") from None
    labels = [v for v in _manifest_labels(source) if Version(v).release[:2] == want]
    if not labels:
        raise ToolchainError(
            f"no redistrib_{cuda}.*.json manifest in {source}",
            tip="NVIDIA's tree lists one per release: redistrib_12.8.1.json",
        )
    label = labels[-1]
    try:
        manifest = json.loads(_read(source, f"redistrib_{label}.json"))
    except json.JSONDecodeError as exc:
        raise ToolchainError(f"redistrib_{label}.json in {source} is not JSON: {exc}") from None
    archives = []
    for component in (*COMPONENTS, *HEADER_ONLY):
        entry = manifest.get(component) if isinstance(manifest, dict) else None
        plat = entry.get(platform) if isinstance(entry, dict) else None
        if not isinstance(plat, dict) or not plat.get("relative_path") or not plat.get("sha256"):
            raise ToolchainError(
                f"redistrib_{label}.json in {source} has no {component} for {platform}"
            )
        archives.append(
            Archive(
                component=component,
                version=str(entry.get("version", "")),  # type: ignore[union-attr]
                relative_path=str(plat["relative_path"]),
                sha256=str(plat["sha256"]).lower(),
                headers_only=component in HEADER_ONLY,
            )
        )
    return Release(label=label, source=source, archives=tuple(archives))


def _unpack(data: bytes, archive: Archive, home: Path, scratch: Path) -> None:
    """Unpack one archive's top directory into ``home`` (only include/ for header-only ones)."""
    tarball = scratch / Path(archive.relative_path).name
    tarball.write_bytes(data)
    out = scratch / archive.component
    try:
        with tarfile.open(tarball, "r:xz") as tf:
            extract(tf, out)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ToolchainError(f"cannot unpack {archive.relative_path}: {exc}") from None
    tops = [p for p in out.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise ToolchainError(f"{archive.relative_path} does not hold one top directory")
    for part in tops[0].iterdir():
        if archive.headers_only and part.name != "include":
            continue
        if part.is_dir():
            shutil.copytree(part, home / part.name, symlinks=True, dirs_exist_ok=True)
        elif part.name not in ("LICENSE",):
            shutil.copy2(part, home / part.name, follow_symlinks=False)
    tarball.unlink()
    shutil.rmtree(out)


def fetch_toolkit(
    cuda: str, dest: Path, *, source: str = REDIST_URL, echo: Callable[[str], None] | None = None
) -> Path:
    """Make ``dest/cuda-<cuda>`` (a CUDA_HOME) from the redist tree; reuse it when made before.
    Every archive's sha256 must match the manifest's."""
    home = dest / f"cuda-{cuda}"
    if (home / STAMP).is_file() and (home / "bin" / "nvcc").is_file():
        return home
    release = find_release(cuda, source)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".redist-", dir=dest) as tmp:
        new_home, scratch = Path(tmp) / "home", Path(tmp) / "scratch"
        new_home.mkdir()
        scratch.mkdir()
        for archive in release.archives:
            (echo or _log.info)(f"{archive.component} {archive.version} from {release.source}")
            data = _read(release.source, archive.relative_path, progress=True)
            got = hashlib.sha256(data).hexdigest()
            if got != archive.sha256:
                raise ToolchainError(
                    f"sha256 mismatch for {archive.relative_path}: the manifest "
                    f"redistrib_{release.label}.json says {archive.sha256}, the file is {got}"
                )
            _unpack(data, archive, new_home, scratch)
        if not (new_home / "bin" / "nvcc").is_file():
            raise ToolchainError(f"the CUDA {release.label} archives hold no bin/nvcc")
        # torch links -L$CUDA_HOME/lib64; the archives ship lib/
        if (new_home / "lib").is_dir() and not (new_home / "lib64").exists():
            os.symlink("lib", new_home / "lib64")
        (new_home / STAMP).write_text(f"redist {release.label} from {release.source}\n")
        if home.exists():
            shutil.rmtree(home)
        os.replace(new_home, home)
    return home


def image_dockerfile(cuda: str, *, base: str) -> str:
    inside = f"/usr/local/cuda-{cuda}"
    return (
        f"FROM {base}\n"
        f"COPY cuda/ {inside}/\n"
        f"ENV CUDA_HOME={inside} PATH={inside}/bin:$PATH\n"
        f'LABEL org.factory.cuda="{cuda}"\n'
    )


def make_cuda_image(home: Path, cuda: str, *, base: str, name: str) -> str:
    """Build ``name`` from ``base`` plus the toolkit in ``home`` (no network, no registry)."""
    # heavy: the docker SDK, imported when used
    from docker.errors import APIError, BuildError

    client = docker_client()
    with tempfile.TemporaryDirectory(prefix=".image-", dir=home.parent) as tmp:
        context = Path(tmp)
        shutil.copytree(home, context / "cuda", symlinks=True)
        (context / "Dockerfile").write_text(image_dockerfile(cuda, base=base))
        try:
            with image_progress(f"docker build of {name}"):
                client.images.build(
                    path=str(context), tag=name, rm=True, pull=False, network_mode="none"
                )
        except (APIError, BuildError) as exc:
            raise ToolchainError(f"building image {name} from {base} failed: {exc}") from None
    return name
