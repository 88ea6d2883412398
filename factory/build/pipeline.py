"""Build cells: plan -> wheelhouse -> source tree -> toolkit -> runner -> (OOM: fewer jobs, resume)
-> tagged, pinned, repaired wheel -> verify -> provenance -> (publish).

This module only orchestrates; each step lives in its own module (what one cell's build is made
of: ``job.py``). The runner and the stores are resolved once per run (``BuildRun``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TypedDict

from factory.build import remote_cache
from factory.build.compile_cache import stats_from_report
from factory.build.job import (
    BuildOptions,
    build_image,
    cache_for,
    cell_work_dir,
    check_cross,
    ensure_floor_sysroot,
    floor_plan,
    make_job,
    planned_cuda_home,
    planned_sysroot,
    prepare_inputs,
    source_date_epoch,
    target_wheelhouse,
)
from factory.build.lease import LEASE_TTL_SECONDS, Hold, hold_cell
from factory.build.progress import attempt_picture, progress_for
from factory.errors import BuildError, FactoryError, OOMError, PlanError, StoreError, VerifyError
from factory.index.publish import publish
from factory.logger import Log, cell_lines
from factory.matrix.cell import sm_names
from factory.matrix.load import Matrix, PlannedCell
from factory.planning.memory_model import BuildMeasurement, MemoryHistory
from factory.planning.planner import BuildPlan, plan_after_oom, plan_build, predicted_peak
from factory.planning.record import record_build
from factory.planning.shared_history import BadRecord, merge_into, push
from factory.reports.build_report import AttemptPicture, build_report_html
from factory.reports.page import write_page
from factory.runners import RunnerKind, get_runner, runner_kind
from factory.runners.base import CompilerReport, Runner, RunResult
from factory.store import Store, open_store
from factory.store.base import published
from factory.toolchain.sysroot import FloorPlan
from factory.units import format_size
from factory.wheels.finalize import finalize_wheel
from factory.wheels.floor import lower_floor_tip, wheel_floor
from factory.wheels.provenance import manifest_name, sha256_file, write_manifest
from factory.wheels.verify import verify_wheel


class AttemptRecord(TypedDict):
    """One attempt as the provenance and the JSON outcome list it."""

    attempt: int
    max_jobs: int
    nvcc_threads: int
    memory_limit_bytes: int
    exit_code: int
    oom_killed: bool
    wall_seconds: float
    compile_peak_rss_bytes: int | None
    max_concurrent_compiles: int | None
    objects_total: int | None
    objects_built: int | None
    cache_hits: int | None
    cache_misses: int | None
    compilers: CompilerReport | None  # the compiler wrappers: archs asked for and compiled
    log: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOutcome:
    cell_id: str
    status: str  # "built" | "unchanged" (rebuilt, same bytes as published) | "skipped" | "dry-run"
    wheel: Path | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    seconds: float = 0.0
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildRun:
    """One run of the pipeline over some cells: its options and what they resolve to, once."""

    opts: BuildOptions
    kind: RunnerKind
    runner: Runner
    store: Store | None  # --store: what is already published there
    shared: Store | None  # the store builders share leases and history records in (--publish)
    publish_to: Store | None  # where --publish puts the wheels: --store, else the matrix's


def open_run(matrix: Matrix, opts: BuildOptions) -> BuildRun:
    """The runner and the stores of a run (nothing is contacted yet)."""
    store = open_store(opts.store) if opts.store else None
    return BuildRun(
        opts=opts,
        kind=runner_kind(opts.runner),
        runner=get_runner(opts.runner, **opts.runner_options),
        store=store,
        shared=store if opts.publish else None,
        publish_to=(store or open_store(matrix.settings.store)) if opts.publish else None,
    )


def load_history(matrix: Matrix, explicit: str | Path | None = None) -> MemoryHistory:
    """--history, else the matrix's memory-history setting, which $FACTORY_MEMORY_HISTORY
    outranks (Settings applies the environment)."""
    path = explicit or matrix.settings.memory_history
    return MemoryHistory.load(path)


# -- one cell ------------------------------------------------------------------------------
def _resolve_plan(pc: PlannedCell, opts: BuildOptions, history: MemoryHistory) -> BuildPlan:
    try:
        plan = plan_build(pc, budget=opts.budget, history=history)
    except PlanError:
        if not opts.hand_picked:
            raise
        # a hand-picked plan runs even where the planner would refuse: that is its point
        budget = opts.budget.resolve().memory_bytes
        unbounded = dataclasses.replace(opts.budget, memory=1 << 50)
        plan = plan_build(pc, budget=unbounded, history=history)
        plan = dataclasses.replace(plan, memory_budget_bytes=budget, reasons=(
            f"the planner refuses a budget of {format_size(budget)} for this cell",))
    if not opts.hand_picked:
        return plan
    jobs = opts.max_jobs or plan.max_jobs
    threads = opts.nvcc_threads or plan.nvcc_threads
    # the plan's sizes are for its own threads: scale them to the archs each job now compiles
    at_once, planned = min(threads, len(pc.cell.archs)), max(1, plan.model_key.concurrent_archs)
    peak = predicted_peak(
        jobs, per_job=plan.per_job_bytes * at_once // planned,
        largest=max(plan.largest_object_bytes, plan.per_job_bytes) * at_once // planned,
        headroom=plan.headroom_bytes,
    )
    verdict = "fits" if peak <= plan.memory_budget_bytes else "does NOT fit"
    return dataclasses.replace(
        plan, max_jobs=jobs, nvcc_threads=threads, predicted_peak_bytes=peak,
        reasons=plan.reasons + (
            f"OVERRIDDEN: MAX_JOBS={jobs} NVCC_THREADS={threads} fixed by hand; the model predicts "
            f"{format_size(peak)}, which {verdict} the "
            f"{format_size(plan.memory_budget_bytes)} budget",
        ),
    )


def describe_dry_run(matrix: Matrix, pc: PlannedCell, plan: BuildPlan,
                     run: BuildRun) -> dict[str, object]:
    """The exact settings the runner would use, from the runner itself; nothing is run."""
    work = cell_work_dir(matrix, pc)
    floor = floor_plan(matrix, pc, run.kind)
    job = make_job(matrix, pc, plan, work=work, src=work / "src",
                   cuda_home=planned_cuda_home(matrix, pc), attempt=1, opts=run.opts,
                   sysroot=planned_sysroot(matrix, pc, floor))
    return {
        "cell": pc.cell.id, "wheel": pc.wheel, "plan": plan.as_dict(), "floor": floor.as_dict(),
        "toolchain": pc.toolchain.as_dict(), "env": dict(job.env),
        "requirements": list(job.requirements),
        "compilers": {**dict(job.compilers or {}), "applies": pc.recipe.describe(pc.cell)},
        "runner": run.runner.describe(job),
    }


def _already_published(pc: PlannedCell, run: BuildRun) -> bool:
    if run.store is None or run.opts.force:
        return False
    return published(run.store).has(pc.content_key, pc.wheel)


def build_cell(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log,
               run: BuildRun | None = None) -> BuildOutcome:
    """One cell through the stages; ``run``: the run's runner and stores (else this cell's).
    Its lines name it by its short id (on GitHub Actions they fold into one group)."""
    with cell_lines(matrix.short_id(pc.cell), pc.cell.id):
        return _build_cell(matrix, pc, opts, log, run or open_run(matrix, opts))


def _build_cell(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log,
                run: BuildRun) -> BuildOutcome:
    t0 = time.monotonic()
    log.step(f"cell {pc.cell.id}")
    if not opts.dry_run and _already_published(pc, run):
        log.detail(f"already published (content key {pc.content_key}, or its wheel "
                   f"{pc.wheel}); nothing to build")
        return BuildOutcome(cell_id=pc.cell.id, status="skipped", seconds=time.monotonic() - t0,
                            detail="already published")
    check_cross(pc, run.kind)
    floor = floor_plan(matrix, pc, run.kind)  # an unreachable floor fails here
    log.detail(floor.describe())
    history = load_history(matrix)
    store = run.shared
    if store is not None and not opts.dry_run:
        bad_records: list[BadRecord] = []
        try:
            merged = merge_into(history, store, bad_records)
            if merged:
                log.detail(f"memory history: {merged} record(s) of other builds merged from "
                           "the store")
        except StoreError as exc:
            log.detail(f"memory history: store records not merged ({exc.message})")
        for bad in bad_records:  # read from a shared store: untrusted, never fatal
            log.detail(f"memory history: skipped {bad.key}: {bad.problem}")
    plan = _resolve_plan(pc, opts, history)
    for reason in plan.reasons:
        log.detail(f"plan: {reason}")
    if opts.dry_run:
        info = describe_dry_run(matrix, pc, plan, run)
        return BuildOutcome(cell_id=pc.cell.id, status="dry-run", detail=json.dumps(info))

    work = cell_work_dir(matrix, pc)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    skipped = BuildOutcome(cell_id=pc.cell.id, status="skipped", detail="already published")
    with _cell_lock(work, log):
        if _already_published(pc, run):  # by the builder we waited for
            log.detail("published by the builder we waited for; nothing to build")
            return dataclasses.replace(skipped, seconds=time.monotonic() - t0)
        if store is None:
            return _build_locked(matrix, pc, opts, log, run=run, plan=plan, history=history,
                                 work=work, t0=t0, floor=floor)
        with hold_cell(store, content_key=pc.content_key, cell=pc.cell.id,
                       ttl=opts.lease_ttl or LEASE_TTL_SECONDS,
                       published=lambda: _already_published(pc, run),
                       on_wait=lambda lease: log.detail(
                           f"{lease.holder} holds this cell's lease in the store; waiting")
                       ) as mine:
            if not mine:
                log.detail("published by another builder; nothing to build")
                return dataclasses.replace(skipped, seconds=time.monotonic() - t0)
            return _build_locked(matrix, pc, opts, log, run=run, plan=plan, history=history,
                                 work=work, t0=t0, floor=floor, lease=mine)


def _share_records(run: BuildRun) -> Callable[[BuildMeasurement], None] | None:
    store = run.shared
    if store is None:
        return None

    def share(measurement: BuildMeasurement) -> None:
        push(store, measurement)

    return share


@contextlib.contextmanager
def _cell_lock(work: Path, log: Log) -> Iterator[None]:
    """One builder per cell on this host: the build tree is shared (resume), so a second builder
    waits for the first, then finds the cell published or resumes its objects."""
    fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.detail("another builder holds this cell; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock, also when the process is killed


def _build_locked(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log, *,
                  run: BuildRun, plan: BuildPlan, history: MemoryHistory, work: Path, t0: float,
                  floor: FloorPlan, lease: Hold | None = None) -> BuildOutcome:
    """The build itself. ``lease`` (when builders share a store): once it is lost the build
    stops before it publishes (LeaseLost), and the publish renews it first with a
    conditional write."""
    src, cuda_home = prepare_inputs(matrix, pc, run.runner, work, log, history=history,
                                    cpus=plan.cpus)
    sysroot = ensure_floor_sysroot(matrix, pc, floor, log)
    epoch = source_date_epoch(matrix, pc)
    run.runner.prepare(make_job(matrix, pc, plan, work=work, src=src, cuda_home=cuda_home,
                                attempt=1, opts=opts, sysroot=sysroot, epoch=epoch))
    # the remote compile cache, synced from here: the build container has no network
    with _remote_cache_synced(matrix, opts, log):
        plan, result, raw, attempts = _run_attempts(
            matrix, pc, run, log, plan=plan, history=history, work=work, src=src,
            cuda_home=cuda_home, sysroot=sysroot, epoch=epoch,
        )
    if lease is not None:
        lease.check()  # taken over while we compiled: the new holder builds it
    wheel = _finish_wheel(matrix, pc, opts, log, raw, work=work, epoch=epoch)
    reached = wheel_floor(wheel)
    log.step(f"glibc floor reached: {reached.why()}; tagged {pc.wheel.rsplit('-', 1)[-1][:-4]}")
    lower = lower_floor_tip(reached, floor)
    if lower:
        log.detail(lower)
    seconds = time.monotonic() - t0
    _write_provenance(matrix, pc, plan, wheel, attempts, result, seconds, opts,
                      floor={**floor.as_dict(), "reached": reached.as_dict()})
    if run.publish_to is None:
        return BuildOutcome(cell_id=pc.cell.id, status="built", wheel=wheel,
                            attempts=tuple(attempts), seconds=seconds)
    status = publish_built(run.publish_to, wheel, log, lease=lease)
    return BuildOutcome(cell_id=pc.cell.id, status=status, wheel=wheel, attempts=tuple(attempts),
                        seconds=seconds)


def publish_built(to: Store, wheel: Path, log: Log, *, lease: Hold | None = None) -> str:
    """Publish a verified wheel (and its provenance beside it): 'built', or 'unchanged' when
    the store has these exact bytes. With a ``lease`` the lease is renewed first with a
    conditional write, and a lost one (LeaseLost) publishes nothing."""
    log.step(f"publish to {to.url}")
    if lease is not None:
        lease.confirm()
    report = publish(to, [wheel])
    if report.unchanged:
        # a reproducible rebuild (--force) of a published cell: the same bytes, nothing to do
        log.detail(f"unchanged: the store already has {wheel.name} with these exact bytes")
        return "unchanged"
    return "built"


def _run_attempts(matrix: Matrix, pc: PlannedCell, run: BuildRun, log: Log, *,
                  plan: BuildPlan, history: MemoryHistory, work: Path, src: Path,
                  cuda_home: Path | None, sysroot: Path | None = None,
                  epoch: int | None = None,
                  ) -> tuple[BuildPlan, RunResult, Path, list[AttemptRecord]]:
    """Attempts until one builds a wheel: after an OOM kill the next resumes with a smaller
    plan. Returns (the last plan, the good attempt's result and raw wheel, every attempt's
    record)."""
    opts = run.opts
    attempts: list[AttemptRecord] = []
    pictures: list[AttemptPicture] = []  # the build report's attempts
    for attempt in range(1, opts.attempts + 1):
        job = make_job(matrix, pc, plan, work=work, src=src, cuda_home=cuda_home,
                       attempt=attempt, opts=opts, sysroot=sysroot, epoch=epoch)
        shutil.rmtree(job.out_dir, ignore_errors=True)
        job.out_dir.mkdir(parents=True)
        log.step(f"attempt {attempt}: MAX_JOBS={plan.max_jobs} NVCC_THREADS={plan.nvcc_threads} "
                 f"memory cap {format_size(plan.memory_budget_bytes)}, log {job.log_path}")
        with progress_for(pc, plan, job, log, history=history, tree=src) as progress:
            result = run.runner.run(job)
        attempts.append(_attempt_record(attempt, plan, result, job.log_path))
        pictures.append(attempt_picture(attempt, plan, result, job, progress, tree=src))
        report = write_page(work / "logs" / f"{opts.run_stamp}-report.html",
                            build_report_html(cell_id=pc.cell.id, attempts=pictures,
                                              wheel=pc.wheel))
        log.detail(f"report: {report}")
        if job.cache_dir is not None:
            stats = stats_from_report(result.report)
            log.detail(f"compile cache: {stats.summary() if stats else 'none reported'}")
        log.detail(record_build(pc, plan, result, build_tree=src, history=history,
                                share=_share_records(run)))
        compilers = result.compilers
        if compilers and (compilers.get("asked_archs") or compilers.get("injected")):
            log.detail(f"nvcc: {_narrowing(compilers)}")
        if result.oom_killed:
            plan = _plan_after_oom(pc, opts, log, plan, result, attempt, history=history)
            continue
        if result.exit_code != 0 or result.wheel is None:
            tail = _log_tail(job.log_path)
            why = f": {compilers['refused']}" if compilers and compilers.get("refused") else ""
            raise BuildError(
                f"{pc.cell.id}: build failed (exit {result.exit_code}){why}; "
                f"full log: {job.log_path}",
                tip="last lines of the log:\n" + tail,
            )
        return plan, result, result.wheel, attempts
    raise OOMError(f"{pc.cell.id}: OOM-killed in all {opts.attempts} attempt(s); "
                   f"logs in {work / 'logs'}")


def _narrowing(compilers: CompilerReport) -> str:
    """What the factory's nvcc wrapper did in one attempt, in one line."""
    parts = []
    if compilers.get("narrowed"):
        parts.append(f"the package asked for {sm_names(compilers['asked_archs'])}; "
                     f"{compilers['narrowed']} call(s) narrowed")
    if compilers.get("injected"):
        parts.append(f"{compilers['injected']} call(s) named no arch")
    return "; ".join(parts) + f"; compiled {sm_names(compilers.get('compiled_archs') or [])}"


def _attempt_record(attempt: int, plan: BuildPlan, result: RunResult,
                    log_path: Path) -> AttemptRecord:
    return {
        "attempt": attempt, "max_jobs": plan.max_jobs, "nvcc_threads": plan.nvcc_threads,
        "memory_limit_bytes": plan.memory_budget_bytes,
        "exit_code": result.exit_code, "oom_killed": result.oom_killed,
        "wall_seconds": round(result.wall_seconds, 1),
        "compile_peak_rss_bytes": result.compile_peak_rss_bytes,
        "max_concurrent_compiles": result.max_concurrent_compiles,
        "objects_total": result.objects_total, "objects_built": result.objects_built,
        "cache_hits": result.cache_hits, "cache_misses": result.cache_misses,
        # the factory's compiler wrappers: archs asked for and compiled, calls narrowed
        "compilers": result.compilers,
        "log": str(log_path),
    }


def _plan_after_oom(pc: PlannedCell, opts: BuildOptions, log: Log, plan: BuildPlan,
                    result: RunResult, attempt: int, *, history: MemoryHistory) -> BuildPlan:
    """Say how the attempt ended and the plan the next one resumes with (fewer jobs)."""
    # (seen on the GPU machine: "after None object(s); resuming with fewer jobs" from
    # a one-attempt build that then stopped)
    done = (f"after {result.objects_built} object(s)" if result.objects_built
            else "before any object finished")
    left = ("resuming with fewer jobs" if attempt < opts.attempts
            else f"no attempt left (--attempts {opts.attempts})")
    log.step(f"attempt {attempt} was OOM-killed {done}; {left}")
    try:
        # A hand-picked plan's OOM says the hand was wrong, not the model: keep it out
        # of the history (seen: a MAX_JOBS=5 demo raised the estimate past a cap the
        # planner's own plan fits).
        return plan_after_oom(
            plan, result.compile_peak_rss_bytes, attempt,
            history=MemoryHistory.scratch() if opts.hand_picked else history,
        )
    except PlanError as exc:
        raise OOMError(
            f"{pc.cell.id}: OOM-killed and no smaller plan is left: {exc.message}"
        ) from None


def _finish_wheel(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log, raw: Path,
                  *, work: Path, epoch: int | None = None) -> Path:
    """The raw wheel tagged, pinned and repaired into the output dir, then verified."""
    log.step("wheel: local version tag, torch pin, auditwheel repair")
    out_dir = opts.out_dir if opts.out_dir.is_absolute() else Path.cwd() / opts.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    post_log = work / "logs" / "wheel.log"
    wheel = finalize_wheel(raw, pc, out_dir, echo=log.detail if opts.verbose else None,
                           log_path=post_log, source_date_epoch=epoch)
    log.step(f"verify {wheel.name}")
    report = verify_wheel(
        wheel, expected=pc, import_check=opts.verify_import,
        wheelhouse=target_wheelhouse(matrix, pc), sysroots=matrix.settings.sysroots_dir,
        raise_on_failure=False, echo=log.detail if opts.verbose else None, log_path=post_log,
    )
    for check in report.checks:
        log.detail(f"{check.status:4} {check.name}: {check.detail}")
    if not report.ok:
        raise VerifyError(f"{wheel.name}: {report.summary()}", tip=f"details: {post_log}")
    return wheel


@contextlib.contextmanager
def _remote_cache_synced(matrix: Matrix, opts: BuildOptions, log: Log) -> Iterator[None]:
    """With ``--cache`` and a remote in the settings: pull what this builder lacks before the
    attempts, push what it compiled after them (also after a failed build: its objects are good).
    An S3 problem is reported and never fails the build."""
    cache = cache_for(matrix, opts)
    if cache is None or cache.remote is None:
        yield
        return

    remote = cache.remote

    def sync(direction: str) -> None:
        try:
            fn = remote_cache.pull if direction == "pull" else remote_cache.push
            log.detail(f"compile cache: {fn(remote, cache.dir).summary()}")
        except FactoryError as exc:
            log.detail(f"compile cache: {exc.message}; building without it")

    sync("pull")
    try:
        yield
    finally:
        sync("push")


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _write_provenance(matrix: Matrix, pc: PlannedCell, plan: BuildPlan, wheel: Path,
                      attempts: list[AttemptRecord], result: RunResult, seconds: float,
                      opts: BuildOptions, floor: dict[str, object] | None = None) -> Path:
    data = {
        "wheel": wheel.name,
        "sha256": sha256_file(wheel),
        "cell": {**pc.cell.as_dict(), "id": pc.cell.id, "variant": pc.variant},
        "content_key": pc.content_key,
        "recipe": {"name": pc.recipe.name, "revision": pc.recipe.revision},
        "toolchain": pc.toolchain.as_dict(),
        "plan": plan.as_dict(),
        "attempts": attempts,
        "build_seconds": round(seconds, 1),
        "peak_memory_bytes": max((a.get("compile_peak_rss_bytes") or 0) for a in attempts),
        "log": attempts[-1]["log"] if attempts else None,
        "builder": {"hostname": socket.gethostname(), "runner": opts.runner,
                    "image": build_image(matrix, pc)},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cache": {"hits": result.cache_hits, "misses": result.cache_misses},
        "floor": floor or {},
    }
    path = wheel.with_name(manifest_name(wheel.name))
    write_manifest(path, data)
    return path


def start_run(matrix: Matrix, opts: BuildOptions) -> BuildRun:
    """``open_run``, with the runner started (once per batch: it clears what a killed run left)
    unless nothing is built."""
    run = open_run(matrix, opts)
    if not opts.dry_run:
        run.runner.start()
    return run


def build_cells(cells: Sequence[PlannedCell], *, matrix: Matrix, opts: BuildOptions,
                log: Log | None = None) -> list[BuildOutcome]:
    log = log or Log()
    run = start_run(matrix, opts)
    return [build_cell(matrix, pc, opts, log, run) for pc in cells]
