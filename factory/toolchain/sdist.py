"""A package's source from a PEP 503 index: the sdist a cell builds from, found on the index's
simple page, checked against the matrix's pin and the index's own hash, fetched once; and
whether a version outside the matrix has one at all (checked before anything is planned)."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.utils import canonicalize_name

from factory.errors import BuildError, CellError, ConfigError
from factory.links import parse_anchors
from factory.toolchain.download import read_with_progress

_log = logging.getLogger(__name__)

DEFAULT_INDEX = "https://pypi.org/simple/"




def configured_index() -> str:
    """The index pip would use: PIP_INDEX_URL, else PyPI."""
    url = os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    return url if url.endswith("/") else url + "/"


def _open(url: str, accept: str, *, timeout: float = 120,
          progress: str | None = None) -> tuple[bytes, str]:
    """GET with credentials from the URL (user:pass@host) sent as basic auth, as pip does;
    with ``progress`` (the file's name) read in chunks behind a progress line."""
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
            if progress:
                return read_with_progress(resp, progress), resp.geturl()
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
    index = (index_url or configured_index()).rstrip("/") + "/"
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
    data, _ = _open(url, "*/*", progress=filename)
    got = hashlib.sha256(data).hexdigest()
    if got != expect:
        raise BuildError(f"sha256 mismatch for {filename}: expected {expect}, got {got}")
    target = dest / filename
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{filename}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, target)
    return target
