"""``factory index verify``: every link on every page resolves, and every hash matches.

Checked: each project page (HTML and JSON) links only to files that exist, with the entry's
sha256 and the ``.metadata`` file's sha256; with ``deep`` the wheels are re-hashed too (a
tampered file is found). And the other way round: every committed wheel appears on its
combined page and on its variant page, and every project page is linked from its root.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict
from urllib.parse import unquote, urljoin

from factory.index.store.base import FILES, METADATA_SUFFIX, Store
from factory.index import pages
from factory.index.links import parse_anchors


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexReport:
    wheels: int
    pages: int
    links: int
    problems: tuple[str, ...]
    pending: tuple[str, ...]  # uploaded but never committed: 'index rebuild' completes them

    @property
    def ok(self) -> bool:
        return not self.problems


def _target_key(page_key: str, href: str) -> str | None:
    """Resolve a relative link the way a client does; None if it leaves the store."""
    resolved = urljoin("http://store/" + page_key, href.split("#", 1)[0])
    if not resolved.startswith("http://store/"):
        return None
    return unquote(resolved[len("http://store/") :])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify_index(store: Store, *, deep: bool = True) -> IndexReport:
    problems: list[str] = []
    entries = store.wheels()
    by_key = {e.key: e for e in entries}
    listing = {o.key: o.size for o in store.list(f"{FILES}/")}
    page_keys = sorted(o.key for o in store.page_objects())
    metadata_hash: dict[str, str] = {}
    wheel_hash: dict[str, str] = {}

    def check_file(page: str, target: str | None, sha: str | None, meta_sha: str | None) -> None:
        if target is None or target not in listing:
            problems.append(f"{page}: link to missing file {target}")
            return
        entry = by_key.get(target)
        if entry is None:
            problems.append(f"{page}: link to {target}, which has no index entry")
            return
        if sha != entry.sha256:
            problems.append(
                f"{page}: sha256 of {entry.filename} is {sha}, the entry says {entry.sha256}"
            )
        if listing[target] != entry.size:
            problems.append(
                f"{page}: {entry.filename} is {listing[target]} bytes, the entry says {entry.size}"
            )
        if deep and target not in wheel_hash:
            data = store.read(target)
            wheel_hash[target] = _sha256(data) if data is not None else ""
        if deep and wheel_hash[target] != entry.sha256:
            problems.append(
                f"{entry.filename}: its bytes do not match sha256 {entry.sha256} (tampered?)"
            )
        if target not in metadata_hash:
            data = store.read(target + METADATA_SUFFIX)
            metadata_hash[target] = _sha256(data) if data is not None else "missing"
        if meta_sha != metadata_hash[target]:
            problems.append(
                f"{page}: core metadata of {entry.filename} does not match ({meta_sha})"
            )

    linked: dict[str, set[str]] = defaultdict(set)  # project page key -> file keys
    roots: dict[str, set[str]] = {}  # root page key -> project names
    links = 0
    for key in page_keys:
        data = store.read(key)
        if data is None:
            continue
        if (
            key.endswith("/index.html")
            and key.count("/") >= 2
            and not key.endswith("simple/index.html")
        ):
            for anchor in parse_anchors(data):
                a, href = anchor.attrs, anchor.href
                sha = href.split("#sha256=", 1)[1] if "#sha256=" in href else None
                meta = a.get("data-core-metadata") or ""
                target = _target_key(key, href)
                check_file(key, target, sha, meta.removeprefix("sha256="))
                if a.get("data-dist-info-metadata") != a.get("data-core-metadata"):
                    problems.append(f"{key}: the two metadata attributes differ for {href}")
                linked[key].add(target or "")
                links += 1
        elif (
            key.endswith("/index.json")
            and key.count("/") >= 2
            and not key.endswith("simple/index.json")
        ):
            try:
                files = json.loads(data)["files"]
            except (ValueError, KeyError, TypeError):
                problems.append(f"{key}: not a PEP 691 project page")
                continue
            for f in files:
                target = _target_key(key, str(f.get("url", "")))
                meta_sha = (f.get("core-metadata") or {}).get("sha256")
                check_file(key, target, f.get("hashes", {}).get("sha256"), meta_sha)
                linked[key].add(target or "")
                links += 1
        elif key.endswith("simple/index.json"):
            roots[key] = pages.root_projects(data)

    # The other way round: nothing committed is missing from the pages.
    for e in entries:
        variants: list[str | None] = [None, e.variant] if e.variant else [None]
        for v in variants:
            for page in pages.project_page_keys(e.project, v):
                if e.key not in linked.get(page, set()):
                    problems.append(f"{page}: {e.filename} is in the store but not on the page")
            root_key = pages.root_page_keys(v)[0]
            if e.project not in roots.get(root_key, set()):
                problems.append(f"{root_key}: project {e.project} is missing")
    top = pages.top_variants(store.read(pages.TOP_KEYS[0]))
    for v in sorted({e.variant for e in entries if e.variant}):
        if v not in top:
            problems.append(f"{pages.TOP_KEYS[0]}: variant {v} is missing")
    for root_key, names in roots.items():
        base = root_key[: -len("index.json")]
        for name in names:
            if f"{base}{name}/index.html" not in page_keys:
                problems.append(f"{root_key}: links to {name}/, which has no page")
    return IndexReport(
        wheels=len(entries),
        pages=len(page_keys),
        links=links,
        problems=tuple(dict.fromkeys(problems)),
        pending=tuple(store.uncommitted_wheels()),
    )
