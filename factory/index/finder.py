"""The finder: one static page (``finder/index.html``) people browse to find a wheel.

Every live wheel is a row (a ``<tbody>`` of its facts and its install line), newest data
first; works from a file, S3 or the embedded server alike, since the page computes the index
URL from where it was loaded. In the page:

- filter by typing, the filter in the URL (``?q=b200 cp312&sort=date-desc&with=uv``), so a view
  can be shared; GPU product names (B200, GB200, H100, RTX PRO 6000, RTX 5090, ...) match the
  wheels whose archs run on them (factory/data/gpus.toml), and the page says which sm that is;
- sortable columns (versions as versions, sizes as bytes);
- the install line for pip, uv, Poetry or PDM: the same text ``factory doctor`` prints (its
  formatter renders each installer once, with placeholders the page fills in per row), with a
  copy button (also where the clipboard API is missing: plain http by host name);
- links to each wheel's variant index, its project page there and the wheel file;
- how each installer is told the CA of an https index a private CA signed (the doctor's words:
  the page cannot know whether one did);
- a layout that holds at 1100 px (the install line under the facts) and on a phone (cards).
"""

from __future__ import annotations

import dataclasses
import html
import importlib.resources
import json
from collections.abc import Iterable

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from factory.errors import WheelError

# The doctor is the one home of the install lines; it sits above the index (an exception
# docs/ARCHITECTURE.md lists: the doctor's formatter imports only matrix, recipes, the bottom).
from factory.hosts.choose import Choice
from factory.hosts.index_reader import IndexAccess
from factory.hosts.probe import PYTHON_FROM_PATH, HostInfo
from factory.hosts.snippets import (
    REPLACES_ROOTS,
    ca_setting,
    pip_command,
    pip_interpreter,
    render_snippet,
)
from factory.index.pages import simple_root
from factory.matrix.cell import sm_names
from factory.matrix.gpus import gpu_sms
from factory.matrix.tags import glibc_floor, parse_local, wheel_platform
from factory.store.base import FILES, WheelEntry
from factory.units import format_size

# What the page fills in, per row, in the installers' templates.
ROOT_TOKEN = "https://index-root.invalid/"
TRUST_HOST_TOKEN = "index-host.invalid"  # plain http by host name: what pip must trust
TRUST_ROOT_TOKEN = f"http://{TRUST_HOST_TOKEN}/"
PATH_TOKEN = "variant-path/simple/"
PROJECT_TOKEN = "project-token"
VERSION_TOKEN = "version-token"
INSTALLERS = (("pip", "pip"), ("uv", "uv"), ("poetry", "Poetry"), ("pdm", "PDM"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinderRow:
    project: str
    filename: str
    size: int
    uploaded: str  # ISO 8601
    yanked: bool


def finder_rows_from_entries(entries: Iterable[WheelEntry]) -> list[FinderRow]:
    return [FinderRow(project=e.project, filename=e.filename, size=e.size, uploaded=e.uploaded,
                      yanked=e.yanked is not None) for e in entries]


def finder_rows_from_page(data: bytes | None) -> list[FinderRow]:
    """Rows from a combined PEP 691 project page (one read per project, not per wheel)."""
    if not data:
        return []
    try:
        doc = json.loads(data)
        return [FinderRow(project=str(doc["name"]), filename=str(f["filename"]),
                          size=int(f["size"]), uploaded=str(f["upload-time"]),
                          yanked=bool(f["yanked"])) for f in doc["files"]]
    except (ValueError, KeyError, TypeError):
        return []


def _page_host() -> HostInfo:
    """The host the page's lines are for: any, with the python3 on its PATH (uv, Poetry and PDM
    read nothing of it; pip's line runs that interpreter)."""
    return HostInfo(python="3", python_exe="python3", python_source=PYTHON_FROM_PATH,
                    torch=None, torch_local=None, torch_cuda=None, torch_error=None, driver=None,
                    gpus=(), gpu_source=None, gpu_note=None, glibc=None, machine="x86_64")


def install_templates() -> dict[str, dict[str, str]]:
    """Each installer's text for one wheel, from the doctor's own formatter, with placeholders
    for the index root, the variant path, the project and the version: ``plain`` for https and
    loopback, ``trust`` for plain http by host name (pip's --trusted-host, PDM's verify_ssl and
    the comment why, the host a placeholder too)."""
    requirement = f"{PROJECT_TOKEN}=={VERSION_TOKEN}"
    host = _page_host()
    out: dict[str, dict[str, str]] = {}
    for kind, root in (("plain", ROOT_TOKEN), ("trust", TRUST_ROOT_TOKEN)):
        url = root + PATH_TOKEN
        choice = Choice(project=PROJECT_TOKEN, wheel="x.whl", variant=None, why=None,
                        index_url=url, requirement=requirement)
        access = IndexAccess(url=root)
        lines = {"pip": "\n".join(pip_command([choice], access, pip_interpreter(host)))}
        for fmt, _ in INSTALLERS[1:]:
            lines[fmt] = render_snippet(fmt, [choice], access, host).rstrip("\n")
        out[kind] = lines
    return out


# The lines cannot know whether a private CA signed an https index's certificate: the page says
# how each installer is told one, in the doctor's words.
CA_FORMS = (("pip", "pip"), ("pip.conf", "pip.conf"), ("uv", "uv"), ("Poetry", "poetry"),
            ("PDM", "pdm"))


def private_ca_note(ca: str = "FILE") -> str:
    forms = ", ".join(f"{label} <code>{html.escape(ca_setting(form, ca))}</code>"
                      for label, form in CA_FORMS)
    return ('<p id="ca-note">An https index whose certificate a private CA '
            f"signed: each installer must be told the CA bundle {html.escape(ca)} (for pip and "
            f"uv {html.escape(REPLACES_ROOTS)}): {forms} in its source; "
            f"<code>factory doctor --cert {html.escape(ca)}</code> prints the lines with it.</p>")


def _key_of(v: Version) -> str:
    """A sort key that orders versions as versions, as text (the page compares strings)."""
    release = ".".join(f"{n:04d}" for n in (*v.release, 0, 0, 0)[:4])
    pre = f"{('a', 'b', 'rc').index(v.pre[0])}{v.pre[1]:03d}" if v.pre else "9"
    return f"1{release}{pre}{v.post or 0:03d}{v.local or ''}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Cells:
    text: dict[str, str]  # column -> what the cell shows
    sort: dict[str, str]  # column -> how it sorts
    archs: tuple[int, ...]  # () for the package's default arch set
    path: str  # the variant index: 'cu130-torch2.14-sm100/simple/'


def _cells(row: FinderRow) -> _Cells:
    _, version, _, tags = parse_wheel_filename(row.filename)  # once: 10 000 rows in a rebuild
    try:
        lt = parse_local(version.local) if version.local else None
    except WheelError:
        lt = None
    variant = lt.variant if lt else None
    pythons = sorted({t.interpreter for t in tags})
    platforms = sorted({t.platform for t in tags})
    archs = tuple(lt.archs) if lt and lt.archs else ()
    arch = (sm_names(archs, "+") if archs else "default") if lt else ""
    text = {
        "package": row.project, "version": str(version),
        "torch": lt.torch_minor if lt else "", "cuda": lt.cuda if lt else "", "arch": arch,
        "python": " ".join(pythons),
        "platform": wheel_platform(platforms) if "any" not in platforms else "any",
        "glibc": glibc_floor(platforms) or "", "size": format_size(row.size),
        "date": row.uploaded[:10],
    }
    # sort keys only where the text does not sort (the page compares numbers in the text as
    # numbers: torch 2.9 before 2.14)
    sort = {**text, "version": _key_of(version), "size": f"{row.size:013d}"}
    return _Cells(text=text, sort=sort, archs=archs, path=simple_root(variant))


COLUMNS = (("package", "Package"), ("version", "Version"), ("torch", "torch"), ("cuda", "CUDA"),
           ("arch", "Arch"), ("python", "Python"), ("platform", "Platform"),
           ("glibc", "glibc &ge;"), ("size", "Size"), ("date", "Date"))

def _asset(name: str) -> str:
    return importlib.resources.files("factory.index").joinpath(name).read_text()


def _row_html(row: FinderRow) -> str:
    c = _cells(row)
    esc = html.escape
    variant_index = f"../{c.path}"
    project_page = f"../{c.path}{row.project}/"
    wheel = f"../{FILES}/{row.project}/{row.filename.replace('+', '%2B')}"
    tds = []
    for key, _ in COLUMNS:
        value = esc(c.text[key])
        if key == "package":
            value = f'<a href="{esc(project_page, quote=True)}">{value}</a>'
        elif key == "version":
            value = f'<a href="{esc(wheel, quote=True)}" class="wheel-link">{value}</a>'
        # the sort key only where it is not the text (the page sorts by the text otherwise)
        sort = c.sort[key]
        attr = f' data-sort="{esc(sort, quote=True)}"' if sort != c.text[key] else ""
        tds.append(f'<td data-key="{key}"{attr}>{value}</td>')
    install = (
        f'<tr class="install"><td colspan="{len(COLUMNS)}"><div class="line">'
        f'<pre class="install-text"></pre><button type="button" class="copy">copy</button>'
        f'</div>variant index <a class="variant-link" href="{esc(variant_index, quote=True)}">'
        f"{esc(c.path)}</a></td></tr>"
    )
    attrs = {"title": row.filename, "data-archs": " ".join(map(str, c.archs))}
    attr = " ".join(f'{k}="{esc(v, quote=True)}"' for k, v in attrs.items())
    return f'<tbody class="wheel" {attr}><tr class="facts">{"".join(tds)}</tr>{install}</tbody>'


def _json_script(element_id: str, value: object) -> str:
    text = json.dumps(value).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def finder_html(rows: Iterable[FinderRow]) -> bytes:
    """Every live wheel (yanked ones are not offered), sorted by package, then upload time."""
    live = sorted((r for r in rows if not r.yanked),
                  key=lambda r: (r.project, r.uploaded, r.filename))
    radios = "".join(
        f'<label><input type="radio" name="installer" value="{fmt}"'
        f'{" checked" if fmt == "pip" else ""}> {label}</label>' for fmt, label in INSTALLERS)
    head = "".join(f'<th data-key="{key}" aria-sort="none"><button type="button">{label}'
                   f"</button></th>" for key, label in COLUMNS)
    datalist = "".join(f'<option value="{html.escape(name, quote=True)}">'
                       for name in gpu_sms())
    body = [
        "<h1>Wheels</h1>",
        '<nav><a href="../">index root</a><a href="../simple/">all variants (/simple/)</a>'
        '<a href="../coverage/" id="coverage-link">coverage</a></nav>',
        '<p class="doctor">Not sure which wheel fits? On the GPU host, '
        '<code id="doctor-line">factory doctor --index ../</code> '
        '<button type="button" class="copy">copy</button> prints the line for its torch, '
        "CUDA and GPU (docs/INDEX.md explains the index, docs/DEPLOY.md the hosts).</p>",
        private_ca_note(),
        '<div class="controls"><label for="filter">Filter</label>'
        '<input id="filter" type="search" list="gpus-list" '
        'placeholder="e.g. flash-attn 2.14 cu130 B200 cp312" autofocus>'
        '<output id="count" for="filter"></output>'
        f'<fieldset><legend hidden>installer</legend>Install with {radios}</fieldset></div>',
        f'<datalist id="gpus-list">{datalist}</datalist>',
        '<p id="gpu-note" aria-live="polite"></p>',
        f'<table id="wheels"><thead><tr>{head}</tr></thead>',
        *(_row_html(r) for r in live),
        "</table>",
        _json_script("install-templates", install_templates()),
        _json_script("gpus", gpu_sms()),
        _json_script("tokens", {"root": ROOT_TOKEN, "trust_root": TRUST_ROOT_TOKEN,
                                "host": TRUST_HOST_TOKEN, "path": PATH_TOKEN,
                                "project": PROJECT_TOKEN, "version": VERSION_TOKEN}),
        f"<script>{_asset('finder.js')}</script>",
    ]
    page = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>Wheels</title>", f"<style>{_asset('finder.css')}</style>", "</head>",
            "<body>", *body,
            "</body>", "</html>", ""]
    return "\n".join(page).encode()
