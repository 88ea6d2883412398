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

import dataclasses
import functools
import html
import json
from collections.abc import Iterable, Sequence
from urllib.parse import quote

from packaging.version import InvalidVersion, Version

from factory.index.store.base import FILES, WheelEntry
from factory.matrix.tags import variant_of_filename

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


# -- the finder: one static page people browse ---------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class FinderRow:
    project: str
    filename: str
    size: int
    uploaded: str  # ISO 8601
    yanked: bool


def finder_rows_from_entries(entries: Iterable[WheelEntry]) -> list[FinderRow]:
    return [
        FinderRow(
            project=e.project,
            filename=e.filename,
            size=e.size,
            uploaded=e.uploaded,
            yanked=e.yanked is not None,
        )
        for e in entries
    ]


def finder_rows_from_page(data: bytes | None) -> list[FinderRow]:
    """Rows from a combined PEP 691 project page (one read per project, not per wheel)."""
    if not data:
        return []
    try:
        doc = json.loads(data)
        return [
            FinderRow(
                project=str(doc["name"]),
                filename=str(f["filename"]),
                size=int(f["size"]),
                uploaded=str(f["upload-time"]),
                yanked=bool(f["yanked"]),
            )
            for f in doc["files"]
        ]
    except (ValueError, KeyError, TypeError):
        return []


def _finder_cells(row: FinderRow) -> dict[str, str]:
    from packaging.utils import parse_wheel_filename

    from factory.matrix.tags import glibc_floor, local_tag_of_filename, wheel_platform

    _, version, _, tags = parse_wheel_filename(row.filename)
    lt = local_tag_of_filename(row.filename)
    variant = _current_variant(row.filename)
    pythons = sorted({t.interpreter for t in tags})
    platforms = sorted({t.platform for t in tags})
    return {
        "package": row.project,
        "version": str(version),
        "torch": lt.torch_minor if lt else "",
        "cuda": lt.cuda if lt else "",
        "arch": ("+".join(f"sm_{a}" for a in lt.archs) if lt.archs else "default") if lt else "",
        "python": " ".join(pythons),
        "platform": wheel_platform(platforms) if "any" not in platforms else "any",
        "glibc": glibc_floor(platforms) or "",
        "size": f"{row.size / 1e6:.1f} MB" if row.size >= 100_000 else f"{row.size / 1e3:.1f} kB",
        "date": row.uploaded[:10],
        "path": simple_root(variant),
        "requirement": f"{row.project}=={version}",
    }


_FINDER_COLUMNS = (
    "package",
    "version",
    "torch",
    "cuda",
    "arch",
    "python",
    "platform",
    "glibc",
    "size",
    "date",
)
_FINDER_HEAD = (
    "Package",
    "Version",
    "torch",
    "CUDA",
    "Arch",
    "Python",
    "Platform",
    "glibc &ge;",
    "Size",
    "Date",
    "Install",
)
# Fills in the index URL (the page works from any host) and filters rows by typed words.
_FINDER_SCRIPT = """
const root = new URL("../", document.location.href).href;
for (const code of document.querySelectorAll("code[data-path]")) {
  code.textContent = "pip install --extra-index-url " + root + code.dataset.path + " "
    + JSON.stringify(code.dataset.requirement);
}
const rows = Array.from(document.querySelectorAll("#wheels tbody tr"));
const filter = document.getElementById("filter");
const count = document.getElementById("count");
function apply() {
  const words = filter.value.toLowerCase().split(/\\s+/).filter(w => w);
  let shown = 0;
  for (const row of rows) {
    const text = row.textContent.toLowerCase();
    const ok = words.every(w => text.includes(w));
    row.hidden = !ok;
    if (ok) shown++;
  }
  count.textContent = shown + " of " + rows.length + " wheels";
}
filter.addEventListener("input", apply);
apply();
"""


def finder_html(rows: Iterable[FinderRow]) -> bytes:
    """Every live wheel, one row each, newest first; filter by typing (static: S3 serves it)."""
    live = sorted(
        (r for r in rows if not r.yanked), key=lambda r: (r.project, r.uploaded, r.filename)
    )
    body = [
        "<h1>Wheels</h1>",
        '<p><label for="filter">Filter</label> '
        '<input id="filter" type="search" placeholder="e.g. flash-attn 2.14 cu130 sm_100 cp312" '
        'autofocus> <output id="count" for="filter"></output></p>',
        '<table id="wheels">',
        "<thead><tr>" + "".join(f"<th>{h}</th>" for h in _FINDER_HEAD) + "</tr></thead>",
        "<tbody>",
    ]
    for row in live:
        cells = _finder_cells(row)
        tds = "".join(f"<td>{html.escape(cells[c])}</td>" for c in _FINDER_COLUMNS)
        install = (
            f'<code data-path="{html.escape(cells["path"], quote=True)}" '
            f'data-requirement="{html.escape(cells["requirement"], quote=True)}">'
            f"pip install --extra-index-url ../{html.escape(cells['path'])} "
            f"&quot;{html.escape(cells['requirement'])}&quot;</code>"
        )
        body.append(
            f'<tr title="{html.escape(row.filename, quote=True)}">{tds}<td>{install}</td></tr>'
        )
    body += ["</tbody>", "</table>", f"<script>{_FINDER_SCRIPT}</script>"]
    head = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        "<title>Wheels</title>",
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}"
        "tbody tr:nth-child(even){background:#f4f4f4}code{font-size:90%}</style>",
        "</head>",
        "<body>",
    ]
    return "\n".join([*head, *body, "</body>", "</html>", ""]).encode()
