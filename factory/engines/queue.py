"""The work queue: a builder takes the next unclaimed group that fits it from the store, builds
it, and asks again, until nothing it could build is left. No static assignment: N identical
workers share the matrix, and an offline or killed worker's groups go to the others.

The protocol (on top of the cell leases of factory.build.lease; written down with them in
docs/LEASES.md, "Group leases"):

1. List what the store lacks: the matrix's cells whose content key is not published, grouped
   by shared kernels, longest first (planning.work).
2. Keep the groups that fit this worker: the planner has a plan for the group's first cell at
   the worker's memory and CPUs, the worker's CPU builds the group's platform
   (toolchain.cross.can_build), and the toolchain is here (or is made on the way).
3. Take the first of them whose group lease (``leases/<group id>.json``, the same conditional
   writes as a cell's lease) is free or expired; a heartbeat renews it while the group builds.
4. Build the group's cells in order with ``--publish``: each cell is still claimed through its
   own cell lease and skipped when published, so a group lease that was lost (a worker paused
   past the TTL) costs time, never a second build of a cell.
   Before building, the store is asked again which of its cells are published (the worker
   this one followed may have finished them between the listing and the claim).
5. Release the group lease and go back to 1. A group that failed here is not tried again by
   this worker (others still may).
6. When every group that fits is held by live leases of other workers, wait (poll) for them to
   be published or to expire (their worker died: take them over); with ``wait=False`` stop.
   When none is left that fits: stop.

A worker killed mid-cell leaves both leases to expire; a waiting worker then takes the group
and the cell, resuming nothing of the dead worker's tree (it has its own) but losing nothing:
every cell is published exactly once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from factory.build.job import BuildOptions
from factory.build.lease import (
    LEASE_TTL_SECONDS,
    POLL_SECONDS,
    CellLease,
    Lease,
    LeaseStore,
    renewing,
)
from factory.build.pipeline import BuildOutcome, build_cells, load_history
from factory.build.readiness import ReadinessChecker
from factory.errors import FactoryError
from factory.logger import Log
from factory.matrix.load import Matrix, PlannedCell
from factory.planning.memory_model import MemoryHistory
from factory.planning.work import Work, WorkGroup, plan_work
from factory.store import open_store
from factory.toolchain.cross import can_build


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerCaps:
    memory_bytes: int
    cpus: int
    machine: str  # this worker's CPU


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueReport:
    outcomes: tuple[BuildOutcome, ...]
    failed: tuple[tuple[str, FactoryError], ...]  # (group name, why)
    not_fitting: tuple[str, ...]  # lines: groups this worker cannot build, and why
    groups_built: int


def fitting(work: Work, caps: WorkerCaps, ready: Callable[[PlannedCell], bool]
            ) -> tuple[list[WorkGroup], list[str]]:
    """The groups this worker can build, longest first, and a line for each it cannot."""
    fits: list[WorkGroup] = []
    lines = [f"{r.name}: {r.reason}" for r in work.refused]
    for g in work.groups:
        if not can_build(builder=caps.machine, target=g.machine):
            lines.append(f"{g.name}: for {g.machine}, this worker is {caps.machine}")
        elif not all(ready(pc) for pc in g.planned):
            lines.append(f"{g.name}: no toolchain here")
        else:
            fits.append(g)
    return fits, lines


def claim(store: LeaseStore, groups: Sequence[WorkGroup], *, ttl: float,
          holder: str | None = None) -> tuple[WorkGroup, CellLease] | list[Lease]:
    """The first group whose lease this worker got; else the live leases of the others."""
    held: list[Lease] = []
    for g in groups:
        lease = CellLease(store, content_key=g.id, cell=g.name, ttl=ttl, holder=holder)
        other = lease.try_acquire()
        if other is None:
            return g, lease
        held.append(other)
    return held


def run_queue(matrix: Matrix, *, caps: WorkerCaps, opts: BuildOptions, log: Log,
              packages: Sequence[str] | None = None, ttl: float = LEASE_TTL_SECONDS,
              poll: float = POLL_SECONDS, wait: bool = True,
              history: MemoryHistory | None = None) -> QueueReport:
    """Take, build and publish groups until none that fits this worker is left (module doc)."""
    assert opts.store and opts.publish, "a queue worker publishes to the shared store"
    store = open_store(opts.store)
    history = history or load_history(matrix)  # what the builds plan with
    checker = ReadinessChecker(matrix.settings, runner=opts.runner)
    readiness: dict[str, bool] = {}

    def ready(pc: PlannedCell) -> bool:
        if pc.cell.id not in readiness:
            readiness[pc.cell.id] = checker.check(pc).buildable
        return readiness[pc.cell.id]

    tried: set[str] = set()
    outcomes: list[BuildOutcome] = []
    failed: list[tuple[str, FactoryError]] = []
    built = 0
    lines: list[str] = []
    while True:
        published = store.published_content_keys()
        missing = [pc for pc in matrix.cells_of(packages) if pc.content_key not in published]
        work = plan_work(missing, memory=caps.memory_bytes, cpus=caps.cpus, history=history,
                         spread=False)
        fits, lines = fitting(work, caps, ready)
        fits = [g for g in fits if g.id not in tried]
        if not fits:
            break
        got = claim(store, fits, ttl=ttl)
        if isinstance(got, list):
            if not wait:
                log.step(f"every group that fits is held by another worker ({len(got)}); "
                         "stopping (no --wait)")
                break
            soonest = min(lease.expires for lease in got) - time.time()
            log.detail(f"{len(got)} group(s) that fit are held by other workers; waiting "
                       f"(the first lease expires in {max(0, soonest):.0f}s)")
            time.sleep(max(0.2, min(poll, soonest + 0.2)))
            continue
        group, lease = got
        tried.add(group.id)
        with renewing(lease):
            # again, now that the lease is ours: the worker we followed may have finished it
            published = store.published_content_keys()
            todo = [pc for pc in group.planned if pc.content_key not in published]
            if not todo:
                continue
            log.step(f"claimed {group.name} ({group.id}, {len(todo)} cell(s) to build, "
                     f"predicted {group.seconds[0] / 60:.0f}-{group.seconds[1] / 60:.0f} min)")
            try:
                outcomes += build_cells(todo, matrix=matrix, opts=opts, log=log)
                built += 1
            except FactoryError as exc:
                failed.append((group.name, exc))
                log.step(f"FAILED {group.name}: {exc.message}")
    return QueueReport(outcomes=tuple(outcomes), failed=tuple(failed),
                       not_fitting=tuple(lines), groups_built=built)
