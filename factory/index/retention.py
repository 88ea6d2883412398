"""Retention: keep the newest N builds of each cell, yank the older ones, delete only when told.

A yanked file stays installable by an exact pin (PEP 592), so lock files and ``==`` pins that
name an old build keep working; deleting it would break them. That is why deletion needs
``--force``, and why even then a cell never loses its last installable build.

Check, then change: ``plan_retention`` decides from the manifests (newest by ``created``) and
returns frozen actions; ``check_plan`` makes sure against the store that every step can be
carried out, before ``apply_retention`` changes anything; ``--dry-run`` prints the plan.

What a killed publisher left (a wheel and its manifest without an index entry) is a leftover,
as ``factory index verify`` (pending) and ``factory index rebuild`` (completes it) treat it: not
a build of its cell yet, never yanked or deleted here, counted once the rebuild committed it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from factory.errors import StoreError, UsageError
from factory.index.publish import yank
from factory.index.writer import update_index
from factory.store.base import ENTRY_SUFFIX, METADATA_SUFFIX, YANK_SUFFIX, WheelEntry
from factory.wheels.provenance import SUFFIX, PublishedBuild, published_builds

KEEP = "keep"
YANK = "yank"
DELETE = "delete"
ALREADY_YANKED = "already-yanked"
LEFTOVER = "leftover"  # a killed publisher's: no entry yet ('factory index rebuild' completes it)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetentionAction:
    action: str  # keep | yank | delete | already-yanked | leftover
    wheel: str
    key: str  # the wheel's store key
    cell_id: str
    created: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plan_retention(
    builds: Sequence[PublishedBuild], *, keep: int, force: bool
) -> list[RetentionAction]:
    if keep < 1:
        raise UsageError("--keep must be at least 1: retention never removes every build of a cell")
    by_cell: dict[str, list[PublishedBuild]] = defaultdict(list)
    actions: list[RetentionAction] = []
    for b in builds:
        if b.committed:
            by_cell[b.manifest.cell.id].append(b)
        else:
            actions.append(_action(LEFTOVER, b, "its publish stopped before its index entry; "
                                   "'factory index rebuild' completes it, retention counts it "
                                   "from then on"))
    for cell_id in sorted(by_cell):
        # Newest first; the filename breaks ties so the plan is the same on every run.
        ordered = sorted(
            by_cell[cell_id], key=lambda b: (b.manifest.created, b.manifest.wheel), reverse=True
        )
        kept, older = ordered[:keep], ordered[keep:]
        live_kept = [b for b in kept if b.yanked is None]
        for b in kept:
            actions.append(_action(KEEP, b, f"one of the newest {keep} build(s) of its cell"))
        for b in older:
            newer = f"superseded by newer builds of {cell_id} (retention keeps {keep})"
            if force and live_kept:
                actions.append(_action(DELETE, b, newer + "; --force"))
            elif force:
                # Every kept build is yanked: this one may be the cell's only installable build.
                actions.append(_action(
                    YANK if b.yanked is None else ALREADY_YANKED, b,
                    "not deleted: no newer build of the cell is installable (all yanked)",
                ))
            elif b.yanked is None:
                actions.append(_action(YANK, b, newer))
            else:
                earlier = f"yanked earlier: {b.yanked or 'no reason'}"
                actions.append(_action(ALREADY_YANKED, b, earlier))
    return actions


def _action(kind: str, b: PublishedBuild, reason: str) -> RetentionAction:
    # The file the step acts on is the one stored under the key, whatever the manifest says.
    return RetentionAction(action=kind, wheel=b.key.rsplit("/", 1)[-1], key=b.key,
                           cell_id=b.manifest.cell.id, created=b.manifest.created, reason=reason)


def check_plan(store: Any, actions: Sequence[RetentionAction],
               builds: Sequence[PublishedBuild]) -> None:
    """Every step can be carried out, or StoreError before anything changed: each wheel to
    yank or delete is committed in the store now, and its manifest names the file it sits
    beside (a manifest naming another file is not a build of this one)."""
    committed = {e.key for e in store.wheels()}
    named = {b.key: b.manifest.wheel for b in builds}
    for a in actions:
        if a.action not in (YANK, DELETE):
            continue
        if named.get(a.key) != a.wheel:
            raise StoreError(
                f"retention stopped before changing anything: {a.key}{SUFFIX} names "
                f"{str(named.get(a.key))[:120]!r}, not the wheel beside it",
                tip="inspect the manifest ('factory show'); remove it if it is not this build's",
            )
        if a.key not in committed:
            raise StoreError(
                f"retention stopped before changing anything: {a.wheel} is no longer committed "
                f"in {store.url} (changed meanwhile?); run it again",
            )


def delete_build(store: Any, key: str) -> None:
    """Remove a published wheel and its side files, and drop it from the index pages.

    The entry goes first (it is what commits a wheel: without it the pages stop listing the
    file), then the wheel (so a concurrent 'index rebuild' cannot re-commit it), then the
    pages, then the side files."""
    entry_data = store.read(key + ENTRY_SUFFIX)
    store.delete(key + ENTRY_SUFFIX)
    store.delete(key)
    if entry_data is not None:
        update_index(store, [WheelEntry.from_json(entry_data)])
    for suffix in (METADATA_SUFFIX, SUFFIX, YANK_SUFFIX):
        store.delete(key + suffix)


def apply_retention(store: Any, actions: Sequence[RetentionAction]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for a in actions:
        if a.action == YANK:
            yank(store, a.wheel, f"retention: {a.reason}")
        elif a.action == DELETE:
            delete_build(store, a.key)
        counts[a.action] += 1
    return dict(counts)


def retain(
    store: Any, *, keep: int, force: bool, dry_run: bool
) -> tuple[list[RetentionAction], dict[str, int]]:
    builds = published_builds(store)
    actions = plan_retention(builds, keep=keep, force=force)
    check_plan(store, actions, builds)
    if dry_run:
        counts: dict[str, int] = defaultdict(int)
        for a in actions:
            counts[a.action] += 1
        return actions, dict(counts)
    return actions, apply_retention(store, actions)
