"""Index pages as pure functions of the wheel entries: PEP 503 HTML and PEP 691 JSON.

HTML carries ``#sha256=`` fragments, ``data-requires-python`` (escaped), ``data-core-metadata``
and ``data-dist-info-metadata`` (PEP 658/714), ``data-yanked`` (PEP 592). JSON is API version
1.1 (PEP 700: ``versions``, ``size``, ``upload-time``) with ``core-metadata`` only: pip 22.3 to
23.0 (23.0.1 is Debian 12's) read a JSON ``dist-info-metadata`` as a string and crash on the
PEP 691 dict, and PEP 714 names the key ``core-metadata``, which they ignore. Links are
relative, so the same tree works from the embedded server, from S3 behind a CDN, or from
``file://``.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Iterable, Sequence
from urllib.parse import quote

from packaging.version import InvalidVersion, Version

from factory.matrix.tags import (
    variant_of_filename,
)
from factory.store.base import FILES, WheelEntry

API_VERSION = "1.1"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".json": JSON_TYPE}


def simple_root(variant: str | None) -> str:
    """The key prefix of an index: 'simple/' or 'cu130-torch2.14/simple/'."""
    return f"{variant}/simple/" if variant else "simple/"


def project_page_keys(project: str, variant: str | None) -> tuple[str, str]:
    base = f"{simple_root(variant)}{project}/index"
    return base + ".json", base + ".html"


def root_page_keys(variant: str | None) -> tuple[str, str]:
    base = f"{simple_root(variant)}index"
    return base + ".json", base + ".html"


TOP_KEYS = ("index.json", "index.html")
FINDER_KEY = "finder/index.html"  # the page people browse: every wheel, filter by typing
# the matrix against the store (factory matrix --html): not derived from the store alone, so
# an index rebuild keeps it as it is
COVERAGE_KEY = "coverage/index.html"
BROWSED_PAGES = (FINDER_KEY, COVERAGE_KEY)  # served at /finder/ and /coverage/


@functools.lru_cache(maxsize=65536)
def _current_variant(filename: str) -> str | None:
    return variant_of_filename(filename)


def entry_variants(entry: WheelEntry) -> tuple[str, ...]:
    """The per-variant indexes a wheel is listed on: the name its filename gives today, plus
    the name stored when it was published, if that differs (variant names before the arch set
    was part of them: their URLs keep working for the wheels already published there)."""
    current = _current_variant(entry.filename)
    names = [v for v in (current, entry.variant) if v]
    return tuple(dict.fromkeys(names))


def file_href(entry: WheelEntry, variant: str | None, suffix: str = "") -> str:
    """Relative link from a project page to a file: pages sit 2 (or 3) levels below the root."""
    up = "../../../" if variant else "../../"
    # Store keys allow only [A-Za-z0-9._+-], so '+' is all there is to escape (and this runs
    # four times per wheel in a rebuild: urllib's quote was a quarter of it).
    return f"{up}{FILES}/{entry.project}/{(entry.filename + suffix).replace('+', '%2B')}"


def _html_page(title: str, body: list[str]) -> bytes:
    head = [
        "<!DOCTYPE html>",
        "<html>",
        "<head>",
        f'<meta name="pypi:repository-version" content="{API_VERSION}">',
        f"<title>{html.escape(title)}</title>",
        "</head>",
        "<body>",
    ]
    return "\n".join([*head, *body, "</body>", "</html>", ""]).encode()


@functools.lru_cache(maxsize=65536)
def _sort_key(version: str) -> tuple[int, Version | str]:
    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)


def project_html(project: str, entries: Sequence[WheelEntry], variant: str | None) -> bytes:
    lines = [f"<h1>Links for {html.escape(project)}</h1>"]
    for e in entries:
        attrs = [f'href="{html.escape(file_href(e, variant))}#sha256={e.sha256}"']
        if e.requires_python:
            attrs.append(f'data-requires-python="{html.escape(e.requires_python, quote=True)}"')
        attrs.append(f'data-core-metadata="sha256={e.metadata_sha256}"')
        attrs.append(f'data-dist-info-metadata="sha256={e.metadata_sha256}"')
        if e.yanked is not None:
            attrs.append(f'data-yanked="{html.escape(e.yanked, quote=True)}"')
        lines.append(f"<a {' '.join(attrs)}>{html.escape(e.filename)}</a><br>")
    return _html_page(f"Links for {project}", lines)


def project_json(project: str, entries: Sequence[WheelEntry], variant: str | None) -> bytes:
    files = []
    for e in entries:
        files.append(
            {
                "filename": e.filename,
                "url": file_href(e, variant),
                "hashes": {"sha256": e.sha256},
                "requires-python": e.requires_python,
                "core-metadata": {"sha256": e.metadata_sha256},
                # PEP 691: a reason string, or true when yanked without one.
                "yanked": (e.yanked or True) if e.yanked is not None else False,
                "size": e.size,
                "upload-time": e.uploaded,
            }
        )
    doc = {
        "meta": {"api-version": API_VERSION},
        "name": project,
        "versions": sorted({e.version for e in entries}, key=_sort_key),
        "files": files,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def root_html(projects: Iterable[str]) -> bytes:
    return _html_page(
        "Simple index",
        [f'<a href="{quote(p)}/">{html.escape(p)}</a><br>' for p in sorted(projects)],
    )


def root_json(projects: Iterable[str]) -> bytes:
    doc = {
        "meta": {"api-version": API_VERSION},
        "projects": [{"name": p} for p in sorted(projects)],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def root_projects(data: bytes | None) -> set[str]:
    """Project names from a root JSON page (empty when absent or unreadable)."""
    if not data:
        return set()
    try:
        return {str(p["name"]) for p in json.loads(data)["projects"]}
    except (ValueError, KeyError, TypeError):
        return set()


def top_html(variants: Iterable[str]) -> bytes:
    lines = [
        "<h1>Package index</h1>",
        '<p>Find a wheel: <a href="finder/">finder/</a></p>',
        '<p>Every variant: <a href="simple/">simple/</a></p>',
        "<p>One variant each:</p>",
    ]
    lines += [
        f'<a href="{quote(v)}/simple/">{html.escape(v)}/simple/</a><br>' for v in sorted(variants)
    ]
    return _html_page("Package index", lines)


def top_json(variants: Iterable[str]) -> bytes:
    return json.dumps({"version": 1, "variants": sorted(variants)}, separators=(",", ":")).encode()


def top_variants(data: bytes | None) -> set[str]:
    if not data:
        return set()
    try:
        return {str(v) for v in json.loads(data)["variants"]}
    except (ValueError, KeyError, TypeError):
        return set()
