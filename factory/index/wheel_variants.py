"""Wheel variants (PEP 825 format, PEP 850 providers): one URL for every host, the installer
picks the build for the host's GPU arch and CUDA driver.

What uv 0.13.9 (on PyPI) does, measured: with ``--preview-features wheel-variants`` it reads
``{name}-{version}-variants.json`` from the project page, asks its built-in NVIDIA provider
for the host's ``sm_arch`` and CUDA driver (``NV_VARIANT_PROVIDER_FORCE_SM_ARCH`` and
``NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION`` override the detection), and treats a version
whose only variants are unsupported as unavailable, so it backtracks to the next version. pip,
Poetry and PDM skip such file names.

So each factory wheel gets a variant-labelled copy: the same version (``+cu130torch2.14sm100``),
a ``*.dist-info/variant.json`` inside, the label at the end of the file name
(``...-linux_x86_64-cu130sm100.whl``), and one ``variants.json`` per version beside it, with
``nvidia :: cuda_version_lower_bound`` (the wheel's CUDA) and ``nvidia :: sm_arch`` (its archs,
``100_real``: cubins only). They live in their own tree, ``wheel-variants/``:
a non-variant wheel of the same version is always compatible (PEP 825), so in one page with the
plain wheels uv would take the highest version, whatever the GPU.

What the provider cannot know: the CUDA of the host's torch (only the driver's), so a host whose
driver runs CUDA 13 but whose torch is a cu128 build still gets the cu130 build; the torch minor
is kept by the wheels' ``torch==X.Y.*`` pins as on the combined index.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import html
import io
import json
import zipfile
from collections import defaultdict
from collections.abc import Iterable

from factory.errors import StoreError, WheelError
from factory.index.pages import API_VERSION, root_html
from factory.index.writer import cas_write
from factory.matrix.cell import sm_tag
from factory.matrix.tags import local_tag_of_filename
from factory.recipes import default_archs_for
from factory.store.base import WHEEL_VARIANTS, Store, WheelEntry, check_key

TREE = WHEEL_VARIANTS
SCHEMA = "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
PROVIDERS = {
    "nvidia": {
        "plugin-api": "nvidia_variant_provider.plugin:NvidiaVariantPlugin",
        "requires": ["nvidia-variant-provider>=0.0.1,<1.0.0"],
    }
}
_MAX_LABEL = 16  # PEP 825: ^[0-9a-z_.]{1,16}$


def properties(
    filename: str, default_archs: Iterable[int] | None
) -> tuple[str, dict[str, dict[str, list[str]]]] | None:
    """(label, properties) of a factory wheel; None when it has no tag or no known arch set."""
    lt = local_tag_of_filename(filename)
    if lt is None:
        return None
    archs = lt.archs if lt.archs is not None else tuple(sorted(default_archs or ()))
    if not archs:
        return None
    cuda = "cu" + lt.cuda.replace(".", "")
    marker = sm_tag(archs)
    label = next(
        (c for c in (cuda + marker, marker) if len(c) <= _MAX_LABEL),
        "v" + hashlib.sha256((cuda + marker).encode()).hexdigest()[:8],
    )
    props = {
        "nvidia": {"cuda_version_lower_bound": [lt.cuda], "sm_arch": [f"{a}_real" for a in archs]}
    }
    return label, props


def variants_doc(labels: dict[str, dict[str, dict[str, list[str]]]]) -> dict[str, object]:
    return {
        "$schema": SCHEMA,
        "default-priorities": {"namespace": ["nvidia"]},
        "providers": PROVIDERS,
        "variants": labels,
    }


def variant_filename(filename: str, label: str) -> str:
    return f"{filename[: -len('.whl')]}-{label}.whl"


def variants_json_name(filename: str) -> str:
    """'fa-1.0+cu130torch2.14sm100-cp311-...whl' -> 'fa-1.0+cu130torch2.14sm100-variants.json'"""
    dist, version = filename.split("-")[:2]
    return f"{dist}-{version}-variants.json"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def label_wheel(data: bytes, doc: dict[str, object]) -> bytes:
    """The wheel with ``*.dist-info/variant.json`` added and listed in RECORD."""
    src = zipfile.ZipFile(io.BytesIO(data))
    names = src.namelist()
    record = next((n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1), None)
    if record is None:
        raise WheelError("wheel has no RECORD")
    variant_json = record.rsplit("/", 1)[0] + "/variant.json"
    payload = json.dumps(doc, indent=2, sort_keys=True).encode()
    rows = [
        r for r in csv.reader(io.StringIO(src.read(record).decode())) if r and r[0] != variant_json
    ]
    rows.insert(
        len(rows) - 1 if rows and rows[-1][0] == record else len(rows),
        [variant_json, _record_hash(payload), str(len(payload))],
    )
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename in (record, variant_json):
                continue
            dst.writestr(info, src.read(info.filename))
        dst.writestr(variant_json, payload, compress_type=zipfile.ZIP_DEFLATED)
        dst.writestr(record, text.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def file_key(project: str, name: str) -> str:
    return check_key(f"{TREE}/files/{project}/{name}")


def write_wheel_variants(store: Store, entries: Iterable[WheelEntry]) -> int:
    """Add the labelled copies of these wheels (if missing), their variants.json and the
    ``wheel-variants/simple/`` pages; returns the number of files written."""
    written = 0
    touched: set[str] = set()
    for e in entries:
        if e.yanked is not None:
            continue
        found = properties(e.filename, default_archs_for(e.project))
        if found is None:
            continue
        label, props = found
        doc = variants_doc({label: props})
        name = variant_filename(e.filename, label)
        if store.read(file_key(e.project, name) + ".sha256") is None:
            data = store.read(e.key)
            if data is None:
                raise StoreError(f"{e.key} vanished from {store.url}")
            labelled = label_wheel(data, doc)
            written += store.put_new(file_key(e.project, name), labelled)
            written += store.put_new(
                file_key(e.project, variants_json_name(e.filename)),
                json.dumps(doc, indent=2, sort_keys=True).encode(),
            )
            # Written last: the pair is complete (and its hash known without a re-read).
            store.put_new(
                file_key(e.project, name) + ".sha256", hashlib.sha256(labelled).hexdigest().encode()
            )
        touched.add(e.project)
    for project in sorted(touched):
        key = f"{TREE}/simple/{project}/index.html"
        written += cas_write(store, [key], functools.partial(_page_of, store, project, key))
    if touched:
        key = f"{TREE}/simple/index.html"
        written += cas_write(store, [key], lambda: {key: _root_page(store)})
    return written


def _project_page(store: Store, project: str) -> bytes:
    prefix = f"{TREE}/files/{project}/"
    keys = sorted(o.key for o in store.list(prefix, sizes=False))
    done = {k[: -len(".sha256")] for k in keys if k.endswith(".sha256")}
    links = []
    for key in keys:
        name = key[len(prefix) :]
        if key in done:
            digest = (store.read(key + ".sha256") or b"").decode()
            links.append((name, f"#sha256={digest}"))
        elif name.endswith("-variants.json"):
            data = store.read(key) or b""
            links.append((name, f"#sha256={hashlib.sha256(data).hexdigest()}"))
    lines = [
        "<!DOCTYPE html>",
        "<html>",
        "<head>",
        f'<meta name="pypi:repository-version" content="{API_VERSION}">',
        f"<title>Links for {html.escape(project)}</title>",
        "</head>",
        "<body>",
        f"<h1>Links for {html.escape(project)}</h1>",
    ]
    for name, fragment in links:
        href = f"../../files/{project}/{name.replace('+', '%2B')}{fragment}"
        lines.append(f'<a href="{html.escape(href)}">{html.escape(name)}</a><br>')
    return "\n".join([*lines, "</body>", "</html>", ""]).encode()


def _page_of(store: Store, project: str, key: str) -> dict[str, bytes]:
    return {key: _project_page(store, project)}


def _root_page(store: Store) -> bytes:
    projects: defaultdict[str, int] = defaultdict(int)
    for o in store.list(f"{TREE}/files/", sizes=False):
        projects[o.key.split("/")[2]] += 1
    return root_html(projects)
