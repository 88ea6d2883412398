"""Refreshing the lock: read the indexes again, resolve the matrix's rules against what they
list, and write ``<matrix>.lock`` when a cell changed (``factory lock``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from factory.errors import ConfigError
from factory.matrix.load import Matrix, PlannedCell, load_matrix
from factory.matrix.lock import (
    Change,
    Lock,
    LockedCell,
    LockedSkip,
    UsedFact,
    changes,
    lock_path,
    read_lock,
    write_lock,
)
from factory.upstream.facts import Facts, cache_dir, load_facts, save_facts
from factory.upstream.read import read_facts
from factory.upstream.sources import DirectorySource, LiveSource, now_iso


def read_indexes(matrix: Matrix, *, timeout: float = 30) -> Facts:
    """The facts as the indexes list them now, through the cache under the work dir (pages
    read again; a wheel's metadata, which never changes, read once); saved there as the facts
    every later command uses. What cannot be read falls back to the facts known before."""
    work = matrix.settings.work_dir
    before = load_facts(work)
    source = DirectorySource(cache_dir(work) / "responses", LiveSource(timeout=timeout),
                             max_age=0, label="cache")
    projects = sorted(p.name for p in matrix.packages.values() if p.source == "pypi")
    facts = read_facts(source, indexes=matrix.indexes, projects=projects, fallback=before)
    stale = [f"{host} could not be read ({why}): its pages are the ones cached before"
             for host, why in sorted(source.unreachable.items())]
    facts = dataclasses.replace(facts, notes=(*facts.notes, *stale))
    save_facts(facts, work)
    return dataclasses.replace(facts, kind="live")


def facts_used(cells: Sequence[PlannedCell], facts: Facts) -> tuple[UsedFact, ...]:
    """Where each fact the cells rest on came from: torch's releases, each torch build, each
    package release."""
    out: dict[tuple[str, str], UsedFact] = {}

    def add(what: str, fact: UsedFact) -> None:
        out.setdefault((what, fact.origin.source), fact)

    versions = sorted({pc.cell.torch for pc in cells}, key=lambda v: [int(x) for x in
                                                                        v.split(".")[:3]])
    releases = [facts.torch[v] for v in versions if v in facts.torch]
    if releases:
        what = f"torch {', '.join(versions)}: releases, Pythons and CPUs"
        add(what, UsedFact(what=what, origin=releases[0].origin))
    for pc in cells:
        c = pc.cell
        index = pc.toolchain.torch_index
        for b in facts.builds_of(c.torch):
            if b.cuda == c.cuda and (b.index is None) == (index is None):
                pin = f"; {b.origin.note}" if b.on_pypi and b.origin.note else ""
                what = (f"PyPI's CUDA of torch {c.torch}: {b.cuda}{pin}" if b.on_pypi else
                        f"torch {c.torch} CUDA {b.cuda} build on {b.index}")
                add(what, UsedFact(what=what, origin=dataclasses.replace(b.origin, note="")))
                break
        release = facts.packages.get(c.package, {}).get(c.version)
        if release is not None and pc.source == "pypi":
            what = f"{c.package} {c.version}: sdist {release.sdist} and its sha256"
            add(what, UsedFact(what=what, origin=release.origin))
    return tuple(out[k] for k in sorted(out))


def lock_of(matrix: Matrix, *, locked: str) -> Lock:
    def floor_of(pc: PlannedCell) -> str | None:
        pkg = matrix.packages[pc.cell.package]
        return pc.manylinux if pc.manylinux != (pkg.manylinux or matrix.settings.manylinux) \
            else None

    cells = tuple(
        LockedCell(
            id=pc.cell.id, package=pc.cell.package, version=pc.cell.version, sdist=pc.sdist,
            sha256=pc.sha256, torch=pc.cell.torch,
            torch_index=pc.toolchain.torch_index or "pypi", torch_wheel=pc.torch_wheel,
            torch_sha256=pc.torch_sha256, cuda=pc.cell.cuda, cuda_release=pc.cuda_release,
            archs=pc.cell.archs, python=pc.cell.python, platform=pc.cell.platform,
            manylinux=floor_of(pc))
        for pc in matrix.cells)
    skips = tuple(LockedSkip(package=s.package, cell=s.cell, reason=s.reason)
                  for s in matrix.skipped)
    return Lock(matrix=matrix.digest, locked=locked, facts=facts_used(matrix.cells, matrix.facts),
                cells=cells, skips=skips)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refresh:
    path: Path  # the lock file
    old: Lock | None
    new: Lock
    changes: tuple[Change, ...]
    written: bool
    facts: Facts

    @property
    def differs(self) -> bool:
        return not self.new.same_cells(self.old)


def refresh_lock(matrix_path: Path, *, offline: bool = False, check: bool = False,
                 timeout: float = 30) -> Refresh:
    """Resolve the matrix at ``matrix_path`` against the indexes (``offline``: against the
    facts this builder has) and write its lock when a cell changed (not with ``check``)."""
    shell = load_matrix(matrix_path, use_lock=False, expand=False)
    facts = shell.facts if offline else read_indexes(shell, timeout=timeout)
    matrix = load_matrix(matrix_path, use_lock=False, facts=facts)
    path = lock_path(matrix_path)
    try:
        old = read_lock(path)
    except ConfigError:
        old = None  # an unreadable lock is replaced (and its cells all show as added)
    new = lock_of(matrix, locked=now_iso())
    if new.same_cells(old) and old is not None:
        return Refresh(path=path, old=old, new=old, changes=(), written=False, facts=facts)
    found = tuple(changes(old, new))
    if not check:
        write_lock(new, path)
    return Refresh(path=path, old=old, new=new, changes=found, written=not check, facts=facts)
