"""Routing for the index server: which page or file a request target names.

The same answer for the read loop and the threaded handler: ``/simple/`` and
``/<variant>/simple/<project>/`` negotiate HTML or PEP 691 JSON, the files of the store are
served by their own names, non-normalized project names are redirected, and anything else is a
404 (there is no fallback to a public index).
"""

from __future__ import annotations

import dataclasses
import re
from urllib.parse import parse_qs, quote, unquote, urlsplit

from packaging.utils import canonicalize_name

from factory.index.pages import BROWSED_PAGES, HTML_TYPE, JSON_TYPE
from factory.index.server_http import negotiate
from factory.matrix.tags import VARIANT_RE
from factory.store.base import WHEEL_VARIANTS

_FILE_SUFFIXES = (".whl", ".whl.metadata", ".whl.provenance.json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Route:
    kind: str  # 'page', 'file', 'redirect', 'not_found', 'not_acceptable'
    key: str = ""  # the store key (page, file) or the Location (redirect)
    ctype: str = ""  # pages: the Content-Type
    vary: str = ""  # pages: the Vary header


_NOT_FOUND = Route(kind="not_found")


def route(target: str, accept: str | None) -> Route:
    """Where a GET goes; the same for the threaded handler and the read loop."""
    split = urlsplit(target)
    raw_path = split.path
    parts = [unquote(p) for p in raw_path.split("/")[1:]]
    if raw_path == "/":
        return _page_route("index", {"format": ["text/html"]}, accept)
    if parts and parts[0] == "files":
        return _file_route(parts[1:], "files", _FILE_SUFFIXES)
    if parts[:2] == [WHEEL_VARIANTS, "files"]:
        return _file_route(parts[2:], f"{WHEEL_VARIANTS}/files", (".whl", "-variants.json"))
    query = parse_qs(split.query)
    if parts and parts[-1] in {"index.html", "index.json"}:
        return _page_file_route(parts)
    for browsed in BROWSED_PAGES:  # /finder/, /coverage/
        top = browsed.split("/")[0]
        if parts[:1] == [top]:
            if parts != [top, ""]:
                return Route(kind="redirect", key=f"/{top}/")
            return _page_route(browsed.removesuffix(".html"), {"format": ["text/html"]}, accept)
    if parts and (VARIANT_RE.match(parts[0]) or parts[0] == WHEEL_VARIANTS):
        prefix, parts = parts[0] + "/", parts[1:]
        if prefix == f"{WHEEL_VARIANTS}/":
            query = {"format": ["text/html"]}  # that tree has HTML pages only
    else:
        prefix = ""
    if not parts or parts[0] != "simple":
        return _NOT_FOUND
    rest = parts[1:]
    if not rest:  # '/simple' without the slash
        return Route(kind="redirect", key=f"/{prefix}simple/")
    if rest == [""]:
        return _page_route(f"{prefix}simple/index", query, accept)
    name = rest[0]
    normal = canonicalize_name(name)
    if len(rest) > 2 or (len(rest) == 2 and rest[1]):
        return _NOT_FOUND
    if name != normal or len(rest) == 1:
        if normal and re.fullmatch(r"[a-z0-9][a-z0-9-]*", normal):
            return Route(kind="redirect", key=f"/{prefix}simple/{quote(normal)}/")
        return _NOT_FOUND
    return _page_route(f"{prefix}simple/{normal}/index", query, accept)


def _page_route(base: str, query: dict[str, list[str]], accept: str | None) -> Route:
    formats = query.get("format") or []
    kind = negotiate(accept, formats[0] if formats else None)
    if kind is None:
        return Route(kind="not_acceptable")
    if kind == "json":
        ctype = JSON_TYPE
    else:
        ctype = HTML_TYPE if HTML_TYPE in (accept or "") else "text/html; charset=utf-8"
    return Route(kind="page", key=f"{base}.{kind}", ctype=ctype, vary="Accept, Accept-Encoding")


def _page_file_route(parts: list[str]) -> Route:
    """'/simple/index.html', '/<variant>/simple/<project>/index.json': the file itself, as a
    static host serves it (no negotiation)."""
    if any(not p for p in parts) or (len(parts) > 1 and parts[0] == "files"):
        return _NOT_FOUND
    ctype = "text/html; charset=utf-8" if parts[-1].endswith(".html") else JSON_TYPE
    return Route(kind="page", key="/".join(parts), ctype=ctype, vary="Accept-Encoding")


def _file_route(parts: list[str], prefix: str, suffixes: tuple[str, ...]) -> Route:
    if len(parts) != 2 or not parts[1].endswith(suffixes):
        return _NOT_FOUND
    return Route(kind="file", key=f"{prefix}/{parts[0]}/{parts[1]}")
