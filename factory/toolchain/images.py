"""Builder images: which base each one stands on, the platform tag its glibc allows, and how the
offline base image is made (debootstrap + docker import) where no image registry is reachable."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from factory.engine import docker_client
from factory.errors import EngineError
from factory.logger import Log, Ticker
from factory.process import find_program, run_command
from factory.units import format_duration, format_size

_log = logging.getLogger(__name__)

DEFAULT_BASE_IMAGE = "factory-base:bookworm"
DEFAULT_WORK_DIR = Path(".cache/factory/work")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What a build needs in the base: an interpreter that can make venvs and build C++ (torch's
# extension builder calls g++ for .cpp files and as nvcc's host compiler). Keep in sync with
# docker/make-base-image.sh, which shares the cached tarball.
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-dev",
    "python3-pip",
    "g++",
    "make",
    "ca-certificates",
    "ccache",  # the compile cache's direct layer (factory.build.compile_cache)
)
# Every image the factory makes carries the key of its package set: one made from an older set
# (say, before ccache was in it) is made again instead of being used as it is.
PACKAGES_LABEL = "org.factory.base-packages"


_CUDA_IMAGE = re.compile(r"factory-cuda:(?P<cuda>\d+\.\d+)-py(?P<python>\d+\.\d+)")
# docker's reference grammar (distribution/reference): [registry[:port]/]path[:tag]
_IMAGE_REFERENCE = re.compile(
    r"(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
)


def make_command(image: str) -> str | None:
    """The command that makes a builder image the factory knows how to make."""
    m = _CUDA_IMAGE.fullmatch(image)
    if m:
        return (f"factory image cuda {m.group('cuda')} --python {m.group('python')} "
                "(offline: --from MIRROR-DIR)")
    if image.startswith("factory-base:"):
        return f"factory image base --name {image}"
    return None


def is_image_reference(name: str) -> bool:
    """Whether docker accepts ``name`` as an image name (checked before docker is asked)."""
    return len(name) <= 255 and _IMAGE_REFERENCE.fullmatch(name) is not None


def packages_key() -> str:
    """The package set's key (docker/make-base-image.sh: ``echo "$packages" | sha256sum``)."""
    return hashlib.sha256((",".join(BASE_PACKAGES) + "\n").encode()).hexdigest()[:12]


def rootfs_tarball(work_dir: Path, suite: str) -> Path:
    """The cached root filesystem; its name carries the package set so a change rebuilds it."""
    return work_dir / "images" / f"rootfs-{suite}-{packages_key()}.tar"


def image_state(client: Any, name: str) -> str:
    """'missing', 'current' (made from today's package set) or 'stale'."""
    labels = _labels(client, name)
    if labels is None:
        return "missing"
    return "current" if labels.get(PACKAGES_LABEL) == packages_key() else "stale"


def image_label(client: Any, name: str, label: str) -> str | None:
    """One label of image ``name`` (None when the image or the label is missing)."""
    return (_labels(client, name) or {}).get(label)


def _labels(client: Any, name: str) -> dict[str, str] | None:
    # heavy: the docker SDK, imported when used
    from docker.errors import ImageNotFound

    try:
        image = client.images.get(name)
    except ImageNotFound:
        return None
    return dict((image.attrs.get("Config") or {}).get("Labels") or {})


def ensure_base_image(
    name: str = DEFAULT_BASE_IMAGE,
    *,
    suite: str = "bookworm",
    work_dir: Path = DEFAULT_WORK_DIR,
    mirror: str | None = None,
) -> str:
    """Make sure image ``name`` exists; make it from a Debian root filesystem when it does not.

    The rootfs tarball is cached under ``work_dir/images``: a fresh engine only re-imports it
    (seconds) instead of running debootstrap again (minutes). Returns the image name.
    """
    client = docker_client()
    state = image_state(client, name)
    if state == "current":
        return name
    if state == "stale":
        _log.info(f"+ image {name} was made from an older package set: making it again")
    tarball = rootfs_tarball(work_dir, suite)
    if not tarball.is_file() or tarball.stat().st_size == 0:
        _debootstrap_tarball(
            tarball, suite=suite, mirror=mirror or os.environ.get("DEBIAN_MIRROR", DEBIAN_MIRROR)
        )
    repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    _log.info(f"+ docker import {tarball} {name}")
    start = time.monotonic()
    # heavy: the docker SDK, imported when used
    from docker.errors import APIError

    size = format_size(tarball.stat().st_size)
    try:
        with image_progress(f"docker import of {size}"):
            client.api.import_image_from_file(
                str(tarball),
                repository=repo,
                tag=tag,
                changes=["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]',
                         f"LABEL {PACKAGES_LABEL}={packages_key()}"],
            )
    except APIError as exc:
        raise EngineError(f"docker import of {tarball} failed: {exc.explanation or exc}") from None
    if image_state(client, name) != "current":
        raise EngineError(f"docker import reported success but image {name} is missing")
    _log.info(f"  imported in {time.monotonic() - start:.0f} s")
    return name


def image_progress(what: str, container: Any = None) -> Ticker:
    """The progress line of a long image step (a container that builds CPython, installs the
    cross compilers, a docker build, an import): the time, and the container's last output
    line when there is a container."""
    start = time.monotonic()

    def render() -> str:
        line = f"{what}: {format_duration(time.monotonic() - start)}"
        if container is not None:
            try:
                last = container.logs(tail=1).decode(errors="replace").strip()
            except Exception:  # the engine's answer is only decoration here
                last = ""
            if last:
                line += f", {last[:100]}"
        return line

    return Ticker(Log(name=__name__), render)


def debootstrap(root: Path, *, suite: str, packages: tuple[str, ...], mirror: str,
                log: Path) -> None:
    """A minimal Debian ``suite`` with ``packages`` in ``root``, without package lists and
    downloaded .debs (100+ MB that nothing needs)."""
    find_program("debootstrap")
    if os.geteuid() != 0:
        raise EngineError(
            "debootstrap needs root to make the base image or the sysroot",
            tip="run 'sudo docker/make-base-image.sh' (or 'sudo factory image base') once; "
            "later runs reuse what it made",
        )
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_command(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite,
             root, mirror],
            log_path=log,
            error=EngineError,
            what="debootstrap",
            progress=True,
            watch=root,
        )
    finally:
        _unmount_under(root)
    for junk in (root / "var/cache/apt/archives", root / "var/lib/apt/lists"):
        for item in junk.glob("*"):
            if item.is_file():
                item.unlink()


def _unmount_under(root: Path) -> None:
    """Unmount what is still mounted inside ``root``: debootstrap mounts /proc in the target
    for its second stage and at times leaves it there (seen in CI: the root filesystem's tar
    then read the host's live processes and failed, and the mount outlived the tree)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return
    top = str(root.resolve())
    inside = [m.split()[1].replace("\\040", " ") for m in mounts if len(m.split()) > 1]
    for point in sorted((m for m in inside if m.startswith(top + "/")), key=len, reverse=True):
        run_command(["umount", "-l", point], error=EngineError, echo=False,
                    what=f"umount {point}")


def debootstrap_foreign(root: Path, *, suite: str, arch: str, packages: tuple[str, ...],
                        mirror: str, log: Path) -> None:
    """The files of a Debian ``suite`` for another CPU (``arch``: dpkg's name, 'arm64') with
    ``packages``, in ``root``: ``debootstrap --foreign`` downloads, then every .deb is unpacked
    with ``dpkg-deb -x``. Nothing runs (no emulated second stage, no maintainer scripts): what
    compiles, links or runs under qemu-user needs the files, not configured packages."""
    find_program("debootstrap", error=EngineError)
    find_program("dpkg-deb", error=EngineError)
    log.parent.mkdir(parents=True, exist_ok=True)
    run_command(
        ["debootstrap", "--foreign", f"--arch={arch}", "--variant=minbase",
         f"--include={','.join(packages)}", suite, root, mirror],
        log_path=log,
        error=EngineError,
        what=f"debootstrap --foreign --arch={arch}",
        progress=True,
        watch=root,
    )
    for deb in sorted((root / "var/cache/apt/archives").glob("*.deb")):
        run_command(["dpkg-deb", "-x", deb, root], log_path=log, error=EngineError, echo=False,
                    what=f"dpkg-deb -x {deb.name}")
        deb.unlink()


def _debootstrap_tarball(tarball: Path, *, suite: str, mirror: str) -> None:
    tarball.parent.mkdir(parents=True, exist_ok=True)
    log = tarball.parent / f"debootstrap-{suite}.log"
    root = Path(tempfile.mkdtemp(prefix="rootfs.", dir=tarball.parent))
    try:
        debootstrap(root, suite=suite, packages=BASE_PACKAGES, mirror=mirror, log=log)
        partial = tarball.with_suffix(".tar.partial")
        run_command(
            ["tar", "-C", root, "-cf", partial, "."],
            log_path=log,
            error=EngineError,
            what="tar of the root filesystem",
            progress=True,
            watch=partial,
        )
        os.replace(partial, tarball)
    finally:
        shutil.rmtree(root, ignore_errors=True)
