"""Writing the index pages: incrementally after a publish or yank, or all of them (rebuild).

Pages are derived; the entries under ``files/`` are the truth. Every page is written with
compare-and-swap in rounds: read the page and its token, then list the entries, then render;
a page equal to its render is done, any other is written only if its token is unchanged. A
page just written (or whose write lost to another writer) is not done: it goes round again,
read and rendered from a listing taken after the write, until a round finds it equal.

Why the confirming round: entries are not only added. A yank is undone by an unyank,
retention deletes builds, so a writer's render can go stale while it waits to write, and a
page can come back to bytes it had before (so its token, a hash of the bytes, is the one the
stale writer read: compare-and-swap alone cannot tell). Held just before its write, a yank
would otherwise write its yanked page after an unyank had found the page already unyanked
and stopped, leaving every page showing a yank the store does not have. With the round, the
last writer of a page always lists the store after its own write, and every writer that
changes the store reads the page after its change: whatever the interleaving, the last page
written is what the store holds when the writers stop.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from factory.errors import ConflictError
from factory.index import finder, pages
from factory.store.base import Store, WheelEntry

_MAX_ATTEMPTS = 200

Render = Callable[[], dict[str, bytes]]


def _content_type(key: str) -> str:
    return pages.CONTENT_TYPES[key[key.rindex(".") :]]


def cas_write(store: Store, keys: Iterable[str], render: Render) -> int:
    """Write ``render()[key]`` for each key with compare-and-swap; returns pages changed.

    ``render`` is called after the pages are read, so whatever it lists is at least as new;
    a key is done once a round finds its page equal to the render (see the module docstring).
    """
    pending = list(keys)
    changed = 0
    for attempt in range(_MAX_ATTEMPTS):
        current = {k: store.read_with_token(k) for k in pending}
        rendered = render()
        unconfirmed = []
        lost = False
        for key in pending:
            data, token = current[key]
            if data == rendered[key]:
                continue  # read before the listing and equal to its render: done
            if store.put_if(key, rendered[key], token, content_type=_content_type(key)):
                changed += 1
            else:
                lost = True
            unconfirmed.append(key)  # written from a listing that may be stale: round again
        if not unconfirmed:
            return changed
        pending = unconfirmed
        if lost:
            time.sleep(random.uniform(0, min(0.2, 0.005 * (attempt + 1))))  # spread the writers
    raise ConflictError(f"gave up writing {pending[0]} after {_MAX_ATTEMPTS} concurrent updates")


def _project_keys(project: str, variants: Iterable[str | None]) -> list[str]:
    return [k for v in variants for k in pages.project_page_keys(project, v)]


def _project_renderer(store: Store, project: str, variants: Iterable[str | None]) -> Render:
    variants = list(variants)

    known: dict[str, WheelEntry] = {}  # entries never change: the next round reuses them

    def render() -> dict[str, bytes]:
        entries = store.wheels(project, known=known)
        known.update((e.key, e) for e in entries)
        out: dict[str, bytes] = {}
        for v in variants:
            chosen = [e for e in entries if v is None or v in pages.entry_variants(e)]
            json_key, html_key = pages.project_page_keys(project, v)
            out[json_key] = pages.project_json(project, chosen, v)
            out[html_key] = pages.project_html(project, chosen, v)
        return out

    return render


def _root_renderer(store: Store, variant: str | None, add: Iterable[str]) -> Render:
    add = set(add)
    json_key, html_key = pages.root_page_keys(variant)

    def render() -> dict[str, bytes]:
        names = pages.root_projects(store.read(json_key)) | add
        return {json_key: pages.root_json(names), html_key: pages.root_html(names)}

    return render


def _top_renderer(store: Store, add: Iterable[str]) -> Render:
    add = set(add)

    def render() -> dict[str, bytes]:
        names = pages.top_variants(store.read(pages.TOP_KEYS[0])) | add
        return {pages.TOP_KEYS[0]: pages.top_json(names), pages.TOP_KEYS[1]: pages.top_html(names)}

    return render


def _finder_renderer(store: Store) -> Render:
    def render() -> dict[str, bytes]:
        # From the combined project pages just written: one read per project, not per wheel.
        projects = sorted(pages.root_projects(store.read(pages.root_page_keys(None)[0])))
        datas = store.read_many([pages.project_page_keys(p, None)[0] for p in projects])
        rows = [r for data in datas for r in finder.finder_rows_from_page(data)]
        return {pages.FINDER_KEY: finder.finder_html(rows)}

    return render


def update_index(store: Store, touched: Iterable[WheelEntry]) -> int:
    """Rewrite only the pages the given wheels appear on; returns the number of pages changed.

    Project pages first, then the roots that link to them, so a link never points at a page
    that is not there yet.
    """
    by_project: dict[str, set[str | None]] = defaultdict(set)
    for e in touched:
        by_project[e.project].add(None)
        by_project[e.project].update(pages.entry_variants(e))
    changed = 0
    for project, variants in sorted(by_project.items()):
        ordered = sorted(variants, key=lambda v: v or "")
        changed += cas_write(
            store, _project_keys(project, ordered), _project_renderer(store, project, ordered)
        )
    by_variant: dict[str | None, set[str]] = defaultdict(set)
    for project, variants in by_project.items():
        for v in variants:
            by_variant[v].add(project)
    for v, projects in sorted(by_variant.items(), key=lambda kv: kv[0] or ""):
        changed += cas_write(store, pages.root_page_keys(v), _root_renderer(store, v, projects))
    new_variants = {v for v in by_variant if v}
    if new_variants:
        changed += cas_write(store, pages.TOP_KEYS, _top_renderer(store, new_variants))
    if by_project:
        changed += cas_write(store, [pages.FINDER_KEY], _finder_renderer(store))
    return changed


@dataclasses.dataclass(frozen=True, kw_only=True)
class RebuildReport:
    wheels: int
    projects: int
    variants: int
    pages_written: int
    pages_unchanged: int
    pages_removed: int
    completed: tuple[str, ...]  # wheels whose publish had stopped before its entry was written
    seconds: float
    temps_removed: tuple[str, ...] = ()  # temp files of killed writers, older than the grace


def rebuild_pages(store: Store) -> RebuildReport:
    """Regenerate every page from the store listing (no wheel is re-hashed). Wheels whose
    publish stopped before their entry are not on the pages: ``publish.rebuild_index`` completes
    them first."""
    started = time.perf_counter()
    # Pages before the listing: see the module docstring.
    existing = {o.key: store.read_with_token(o.key) for o in store.page_objects()}
    entries = store.wheels()
    wanted, counts = _render_all(entries)
    written = unchanged = 0
    lost_race: list[str] = []
    for key, data in wanted.items():  # project pages before the roots
        old, token = existing.get(key, (None, None))
        if old == data:
            unchanged += 1
        elif store.put_if(key, data, token, content_type=_content_type(key)):
            written += 1
        else:
            lost_race.append(key)
    removed = 0
    for key in existing:
        if key not in wanted and _is_page(key) and key != pages.COVERAGE_KEY:
            store.delete(key)
            removed += 1
    if written or removed or lost_race:
        # The confirming round, for all pages at once: a listing after the writes. Where it
        # differs from the one the pages were rendered from (a yank, unyank, publish or delete
        # meanwhile), or a write lost, the incremental way redoes those wheels' pages.
        again = store.wheels(known={e.key: e for e in entries})
        moved = set(entries) ^ set(again)
        if lost_race:
            moved |= {e for e in again if _on_pages(e, lost_race)}
        if moved:
            written += update_index(store, moved)
    return RebuildReport(
        wheels=len(entries),
        projects=counts[0],
        variants=counts[1],
        pages_written=written,
        pages_unchanged=unchanged,
        pages_removed=removed,
        completed=(),
        seconds=time.perf_counter() - started,
    )


def _render_all(entries: list[WheelEntry]) -> tuple[dict[str, bytes], tuple[int, int]]:
    """Every page the entries make, project pages first; and (projects, variants)."""
    by_project: dict[str, list[WheelEntry]] = defaultdict(list)
    for e in entries:
        by_project[e.project].append(e)
    wanted: dict[str, bytes] = {}
    variant_projects: dict[str, set[str]] = defaultdict(set)
    for project, project_entries in by_project.items():
        json_key, html_key = pages.project_page_keys(project, None)
        wanted[json_key] = pages.project_json(project, project_entries, None)
        wanted[html_key] = pages.project_html(project, project_entries, None)
        per_variant: dict[str, list[WheelEntry]] = defaultdict(list)
        for e in project_entries:
            for v in pages.entry_variants(e):
                per_variant[v].append(e)
        for v, chosen in per_variant.items():
            variant_projects[v].add(project)
            json_key, html_key = pages.project_page_keys(project, v)
            wanted[json_key] = pages.project_json(project, chosen, v)
            wanted[html_key] = pages.project_html(project, chosen, v)
    root_sets: list[tuple[str | None, set[str]]] = [
        (None, set(by_project)),
        *variant_projects.items(),
    ]
    for root_variant, names in root_sets:
        json_key, html_key = pages.root_page_keys(root_variant)
        wanted[json_key] = pages.root_json(names)
        wanted[html_key] = pages.root_html(names)
    wanted[pages.TOP_KEYS[0]] = pages.top_json(variant_projects)
    wanted[pages.TOP_KEYS[1]] = pages.top_html(variant_projects)
    wanted[pages.FINDER_KEY] = finder.finder_html(finder.finder_rows_from_entries(entries))
    return wanted, (len(by_project), len(variant_projects))


def _is_page(key: str) -> bool:
    return key.endswith(("/index.html", "/index.json")) or key in pages.TOP_KEYS


def _on_pages(entry: WheelEntry, keys: list[str]) -> bool:
    if any(
        k in pages.TOP_KEYS
        or k == pages.FINDER_KEY
        or k.endswith("simple/index.html")
        or k.endswith("simple/index.json")
        for k in keys
    ):
        return True
    return any(f"/{entry.project}/index." in k for k in keys)
