"""One project's files on a simple index: PEP 691 JSON where the index serves it (PyPI), else
the PEP 503 HTML page (PyTorch's per-CUDA indexes, a plain mirror)."""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from typing import Any

from packaging.utils import canonicalize_name

from factory.errors import UpstreamError
from factory.links import parse_anchors
from factory.upstream.sources import Response


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    url: str  # absolute, without the hash fragment
    sha256: str | None
    requires_python: str | None
    yanked: bool
    upload_time: str | None  # PEP 700, JSON pages only
    core_metadata: bool  # PEP 658/714: '<url>.metadata' is served
    size: int | None


def project_url(index: str, project: str) -> str:
    """'https://pypi.org/simple/' + 'Flash_Attn' -> 'https://pypi.org/simple/flash-attn/'."""
    return index.rstrip("/") + "/" + canonicalize_name(project) + "/"


def project_files(response: Response) -> list[IndexFile]:
    """The files a project page lists; an unreadable page is an UpstreamError."""
    body = response.body.lstrip()
    if "json" in response.content_type or body.startswith(b"{"):
        return _from_json(response)
    return _from_html(response)


def _from_json(response: Response) -> list[IndexFile]:
    try:
        doc = json.loads(response.body)
        files = doc["files"]
        if not isinstance(files, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise UpstreamError(f"{response.url}: not a PEP 691 project page") from None
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str):
            continue
        hashes: dict[str, Any] = f["hashes"] if isinstance(f.get("hashes"), dict) else {}
        meta: Any = f.get("core-metadata", f.get("dist-info-metadata", False))
        size = f.get("size")
        out.append(IndexFile(
            filename=f["filename"],
            url=urllib.parse.urljoin(response.url, str(f.get("url", ""))).split("#")[0],
            sha256=_hex(hashes.get("sha256")),
            requires_python=f.get("requires-python") or None,
            yanked=bool(f.get("yanked", False)),
            upload_time=f.get("upload-time") if isinstance(f.get("upload-time"), str) else None,
            core_metadata=bool(meta),
            size=size if isinstance(size, int) else None,
        ))
    return out


def _from_html(response: Response) -> list[IndexFile]:
    out = []
    for anchor in parse_anchors(response.body):
        if not anchor.href:
            continue
        url = urllib.parse.urljoin(response.url, anchor.href)
        parts = urllib.parse.urlsplit(url)
        filename = urllib.parse.unquote(parts.path.rsplit("/", 1)[-1])
        if not filename:
            continue
        frag = parts.fragment
        sha = frag.split("=", 1)[1] if frag.startswith("sha256=") else None
        meta = anchor.attrs.get("data-core-metadata", anchor.attrs.get("data-dist-info-metadata"))
        out.append(IndexFile(
            filename=filename,
            url=url.split("#")[0],
            sha256=_hex(sha),
            requires_python=anchor.attrs.get("data-requires-python") or None,
            yanked="data-yanked" in anchor.attrs,
            upload_time=None,
            core_metadata=meta is not None and meta != "false",
            size=None,
        ))
    return out


def _hex(value: object) -> str | None:
    if isinstance(value, str) and len(value) == 64:
        try:
            int(value, 16)
        except ValueError:
            return None
        return value.lower()
    return None
