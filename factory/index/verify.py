"""``factory index verify``: every link on every page resolves, and every hash matches.

Checked: each project page (HTML and JSON) links only to files that exist, with the entry's
sha256, the ``.metadata`` file's sha256 and the store's yank state (a ``.yank.json`` and its
reason, PEP 592); with ``deep`` the wheels are re-hashed too (a tampered file is found). And
the other way round: every committed wheel appears on its combined page and on its variant
page, and every project page is linked from its root.
Symlinks in the store are problems; temp files of writers (live or killed) are reported.
What builders share through the store is checked too: a history record or a lease object
that does not parse is named (builders skip such a record and take such a lease over).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import unquote, urljoin

from factory.build.lease import LEASE_PREFIX, check_lease
from factory.errors import WheelError
from factory.index import pages
from factory.links import parse_anchors
from factory.planning.shared_history import read_records
from factory.store.base import (
    ENTRY_SUFFIX,
    FILES,
    METADATA_SUFFIX,
    PROVENANCE_SUFFIX,
    YANK_SUFFIX,
    Store,
    WheelEntry,
)
from factory.wheels.binaries import check_floor
from factory.wheels.floor import wheel_floor


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexReport:
    wheels: int
    pages: int
    links: int
    problems: tuple[str, ...]
    pending: tuple[str, ...]  # uploaded but never committed: 'index rebuild' completes them
    # with ``deep``: each wheel's glibc floor, promised (its tag) and needed (its binaries)
    floors: tuple[dict[str, object], ...] = ()
    temps: tuple[str, ...] = ()  # writers' temp files ('index rebuild' removes stale ones)
    # side files whose wheel is gone (a deletion that stopped before its last step): harmless
    # (nothing links to them, and a new publish of the name replaces them)
    orphans: tuple[str, ...] = ()

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
    checker = _LinkChecker(store, entries, deep=deep)
    page_keys = sorted(o.key for o in store.page_objects())
    linked: dict[str, set[str]] = defaultdict(set)  # project page key -> file keys
    roots: dict[str, set[str]] = {}  # root page key -> project names
    links = 0
    for key in page_keys:
        data = store.read(key)
        if data is None:
            continue
        if key.endswith("simple/index.json"):
            roots[key] = pages.root_projects(data)
            continue
        if key.count("/") < 2 or key.endswith("simple/index.html"):
            continue
        if key.endswith("/index.html"):
            page_links: list[_Link] = _html_links(key, data)
        elif key.endswith("/index.json"):
            json_links = _json_links(key, data)
            if json_links is None:
                problems.append(f"{key}: not a PEP 691 project page")
                continue
            page_links = json_links
        else:
            continue
        for link in page_links:
            problems += checker.problems(key, link)
            if link.problem:
                problems.append(link.problem)
            linked[key].add(link.target or "")
            links += 1
    problems += _missing_from_pages(store, entries, linked, roots, page_keys)
    problems += checker.floor_problems
    problems += _shared_object_problems(store)
    temps = []
    for stray in store.strays():
        if stray.kind == "symlink":
            problems.append(f"{stray.key}: a symlink in the store (never served; remove it)")
        else:
            temps.append(f"{stray.key} ({stray.age:.0f} s old)")
    return IndexReport(
        temps=tuple(temps),
        orphans=_orphans(checker.listing),
        wheels=len(entries),
        pages=len(page_keys),
        links=links,
        problems=tuple(dict.fromkeys(problems)),
        pending=tuple(store.uncommitted_wheels()),
        floors=tuple(checker.floors[name] for name in sorted(checker.floors)),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Link:
    """A file link on a project page, with the hashes the page gives for it."""

    target: str | None  # the store key it resolves to; None if it leaves the store
    sha256: str | None
    metadata_sha256: str | None
    yanked: str | None = None  # the reason the page shows (PEP 592), None when not yanked
    problem: str | None = None  # something wrong with the link itself


def _html_links(key: str, data: bytes) -> list[_Link]:
    out = []
    for anchor in parse_anchors(data):
        a, href = anchor.attrs, anchor.href
        differ = a.get("data-dist-info-metadata") != a.get("data-core-metadata")
        out.append(
            _Link(
                target=_target_key(key, href),
                sha256=href.split("#sha256=", 1)[1] if "#sha256=" in href else None,
                metadata_sha256=(a.get("data-core-metadata") or "").removeprefix("sha256="),
                yanked=a.get("data-yanked"),
                problem=f"{key}: the two metadata attributes differ for {href}" if differ else None,
            )
        )
    return out


def _json_links(key: str, data: bytes) -> list[_Link] | None:
    """The files of a PEP 691 project page; None when it is not one."""
    try:
        files = json.loads(data)["files"]
    except (ValueError, KeyError, TypeError):
        return None
    return [
        _Link(
            target=_target_key(key, str(f.get("url", ""))),
            sha256=f.get("hashes", {}).get("sha256"),
            metadata_sha256=(f.get("core-metadata") or {}).get("sha256"),
            yanked=_json_yank(f.get("yanked")),
        )
        for f in files
    ]


def _json_yank(value: object) -> str | None:
    """PEP 691's ``yanked``: false, true (no reason) or the reason."""
    if value is True:
        return ""
    return value if isinstance(value, str) else None


class _LinkChecker:
    """Each link against the store: the file and its entry exist, sizes and hashes agree. A file
    is read (deep) and its ``.metadata`` hashed once, however many pages link to it."""

    def __init__(self, store: Store, entries: list[WheelEntry], *, deep: bool) -> None:
        self._store, self._deep = store, deep
        self._by_key = {e.key: e for e in entries}
        self.listing = {o.key: o.size for o in store.list(f"{FILES}/")}
        self._wheel_hash: dict[str, str] = {}
        self._metadata_hash: dict[str, str] = {}
        self.floors: dict[str, dict[str, object]] = {}  # filename -> its floor (deep only)
        self.floor_problems: list[str] = []

    def problems(self, page: str, link: _Link) -> list[str]:
        target = link.target
        if target is None or target not in self.listing:
            return [f"{page}: link to missing file {target}"]
        entry = self._by_key.get(target)
        if entry is None:
            return [f"{page}: link to {target}, which has no index entry"]
        problems = []
        if link.sha256 != entry.sha256:
            problems.append(
                f"{page}: sha256 of {entry.filename} is {link.sha256}, "
                f"the entry says {entry.sha256}"
            )
        if self.listing[target] != entry.size:
            problems.append(
                f"{page}: {entry.filename} is {self.listing[target]} bytes, "
                f"the entry says {entry.size}"
            )
        if self._deep and self._hash(self._wheel_hash, target, "") != entry.sha256:
            problems.append(
                f"{entry.filename}: its bytes do not match sha256 {entry.sha256} (tampered?)"
            )
        if link.yanked != entry.yanked:
            problems.append(_yank_problem(page, entry, link.yanked))
        if link.metadata_sha256 != self._hash(self._metadata_hash, target, METADATA_SUFFIX):
            problems.append(
                f"{page}: core metadata of {entry.filename} does not match "
                f"({link.metadata_sha256})"
            )
        return problems

    def _hash(self, cache: dict[str, str], target: str, suffix: str) -> str:
        if target not in cache:
            data = self._store.read(target + suffix)
            cache[target] = _sha256(data) if data is not None else ("missing" if suffix else "")
            if not suffix and data is not None and target in self._by_key:
                name = self._by_key[target].filename
                self.floors[name] = _floor(name, data, self.floor_problems)
        return cache[target]


def _yank_problem(page: str, entry: WheelEntry, shown: str | None) -> str:
    """A page whose yank state is not the store's (a writer wrote from a stale listing):
    installers skip a file that is not yanked, or offer one that is."""
    if entry.yanked is None:
        return (
            f"{page}: shows {entry.filename} as yanked ({shown!r}), but the store has no yank "
            "record for it ('factory index rebuild' rewrites the page)"
        )
    if shown is None:
        return (
            f"{page}: shows {entry.filename} as not yanked, but the store yanked it "
            f"({entry.yanked!r}; 'factory index rebuild' rewrites the page)"
        )
    return f"{page}: shows {entry.filename} yanked for {shown!r}, the store for {entry.yanked!r}"


def _floor(filename: str, data: bytes, problems: list[str]) -> dict[str, object]:
    """A wheel's floor for the report; a tag promising less than the binaries need is a
    problem (factory.wheels.binaries.check_floor says it the same way)."""
    try:
        floor = wheel_floor(Path(filename), data)
    except WheelError as exc:
        problems.append(exc.message)
        return {"wheel": filename, "floor": None}
    check = check_floor(filename, floor)
    if not check.ok:
        problems.append(f"{filename}: {check.detail}")
    return {"wheel": filename, "ok": check.ok, **floor.as_dict()}


def _orphans(listing: dict[str, int]) -> tuple[str, ...]:
    """Side files (.metadata, manifest, yank record) whose wheel and entry are both gone."""
    out = []
    for key in sorted(listing):
        for suffix in (METADATA_SUFFIX, PROVENANCE_SUFFIX, YANK_SUFFIX):
            if key.endswith(suffix):
                wheel = key[: -len(suffix)]
                if wheel not in listing and wheel + ENTRY_SUFFIX not in listing:
                    out.append(key)
    return tuple(out)


def _shared_object_problems(store: Store) -> list[str]:
    """History records and lease objects that are not what builders write."""
    _, bad = read_records(store)
    problems = [f"{b.key}: {b.problem} (builders skip it; remove it)" for b in bad]
    keys = sorted(o.key for o in store.list(f"{LEASE_PREFIX}/", sizes=False))
    now = time.time()
    for key, data in zip(keys, store.read_many(keys), strict=True):
        problem = check_lease(key, data, now=now) if data is not None else None
        if problem is not None:
            problems.append(problem)
    return problems


def _missing_from_pages(
    store: Store,
    entries: list[WheelEntry],
    linked: dict[str, set[str]],
    roots: dict[str, set[str]],
    page_keys: list[str],
) -> list[str]:
    """The other way round: every committed wheel is on its pages, every project on its root,
    every variant on the top page, and every project a root lists has a page."""
    problems = []
    for e in entries:
        for v in [None, *pages.entry_variants(e)]:
            for page in pages.project_page_keys(e.project, v):
                if e.key not in linked.get(page, set()):
                    problems.append(f"{page}: {e.filename} is in the store but not on the page")
            root_key = pages.root_page_keys(v)[0]
            if e.project not in roots.get(root_key, set()):
                problems.append(f"{root_key}: project {e.project} is missing")
    top = pages.top_variants(store.read(pages.TOP_KEYS[0]))
    for v in sorted({v for e in entries for v in pages.entry_variants(e)}):
        if v not in top:
            problems.append(f"{pages.TOP_KEYS[0]}: variant {v} is missing")
    for root_key, names in roots.items():
        base = root_key[: -len("index.json")]
        for name in names:
            if f"{base}{name}/index.html" not in page_keys:
                problems.append(f"{root_key}: links to {name}/, which has no page")
    return problems
