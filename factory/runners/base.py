"""What a runner is: one Protocol, the job it runs and the result it reports.

A runner takes a prepared source tree (the lead's build stage copied/unpacked it and applied the
recipe's fixes) and turns it into a raw wheel under memory, CPU and process caps, with the
network off. It measures what the planner needs (compiler peak memory, concurrency) and says
plainly whether the build was killed for memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypedDict, cast

from factory.toolchain.cross import inside_cross

# Inside paths are the same on every run: object files in build/ stay valid when an OOM retry
# resumes, and compile commands (hence compile-cache keys) do not change between cells.
INSIDE_ROOT = "/factory"
INSIDE = {
    "src": f"{INSIDE_ROOT}/src",
    "out": f"{INSIDE_ROOT}/out",
    "wheelhouse": f"{INSIDE_ROOT}/wheelhouse",
    "cuda": f"{INSIDE_ROOT}/cuda",
    "venv": f"{INSIDE_ROOT}/venv",
    "cache": f"{INSIDE_ROOT}/cache",
    "run": f"{INSIDE_ROOT}/run",
    "log": f"{INSIDE_ROOT}/log",
    "sysroot": f"{INSIDE_ROOT}/sysroot",
    "target_wheelhouse": f"{INSIDE_ROOT}/target-wheelhouse",
}

LineCallback = Callable[[str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildJob:
    cell_id: str
    python: str = "3.11"
    image: str | None = None  # docker / cibuildwheel image; unused by the local runner
    src_dir: Path  # prepared, writable source tree; the build runs in it (build/ persists)
    out_dir: Path  # the raw wheel lands here
    wheelhouse: Path  # offline wheels for this Python (wheelhouse.prepare_wheelhouse)
    cuda_home: Path | None  # None: the image has its own toolkit (CUDA_HOME from the image)
    requirements: tuple[str, ...]  # installed offline before the build: torch==X, build deps
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the recipe's knobs
    memory_limit_bytes: int | None = None  # None: uncapped (local runner must be told so)
    cpus: float | None = None
    pids_limit: int | None = 4096
    log_path: Path  # the full build log, streamed as it is written
    cache_dir: Path | None = None  # compile cache (sccache) shared by builds; None: off
    cache_size: str = "20G"  # SCCACHE_CACHE_SIZE: the cache's bound
    timeout: float | None = None  # seconds for the whole run; None: no limit
    venv_dir: Path | None = None  # this exact venv; else one under venv_root, else per cell
    venv_root: Path | None = None  # venvs shared by every build with the same environment
    # the glibc sysroot (factory.toolchain.sysroot) the compilers link against; None: the
    # builder's own glibc and libstdc++
    sysroot: Path | None = None
    # A cross build (factory.toolchain.cross): the CPU the wheel is for, where its torch comes
    # from (the target wheelhouse) and what is unpacked from there; None: a native build.
    cross_target: str | None = None
    target_wheelhouse: Path | None = None
    target_requirements: tuple[str, ...] = ()
    target_pip_platforms: tuple[str, ...] = ()
    # The factory's compiler wrappers (factory.recipes.base.Recipe.compilers): the cell's archs,
    # the C++ standard torch needs; None: the build's compilers as they are.
    compilers: Mapping[str, Any] | None = None
    # the build frontend checks the sdist's [build-system] requires (pypa/build); False: skip
    check_build_requires: bool = True

    def inside_compilers(self, toolkit_dir: str, log: str) -> dict[str, Any] | None:
        """The job file's ``compilers`` section: where the wrapped toolkit is made and where the
        wrappers log what they changed."""
        if self.compilers is None:
            return None
        return {**self.compilers, "dir": toolkit_dir, "log": log}

    def inside_cross(self, venv: str, wheelhouse: str) -> dict[str, Any] | None:
        """The job file's ``cross`` section, with the runner's paths (None: a native build).
        The target's files live in the venv, which is made for this target alone."""
        if self.cross_target is None:
            return None

        return inside_cross(
            target=self.cross_target, python=self.python,
            target_dir=f"{venv}/target-{self.cross_target}",
            wheelhouse=wheelhouse, requirements=self.target_requirements,
            pip_platforms=list(self.target_pip_platforms),
            compilers=self.sysroot is None,  # else the sysroot's wrappers (CC, CXX, LDSHARED)
        )

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    def venv_for(self, runner: str) -> Path:
        """Where the build's venv lives (made once, reused by retries and by other cells).

        Per runner: a venv made in the container (python at /factory/venv) is useless on the host
        and the other way round. Under ``venv_root`` the name holds a key of everything that
        decides the venv's content, so cells with the same torch share one (a torch install is
        about 5 GB) and a different set never lands in a venv another build is using.
        """
        if self.venv_dir is not None:
            return self.venv_dir
        if self.venv_root is not None:
            return self.venv_root / shared_venv_name(
                runner, self.python, self.image, self.requirements
            )
        return self.src_dir.parent / f"venv-{runner}-{self.python_tag}"


def shared_venv_name(
    runner: str, python: str, image: str | None, requirements: Sequence[str]
) -> str:
    """``<runner>-<cp tag>-<key>``: the key covers the interpreter's source and the requirements."""
    doc = json.dumps([runner, python, image or "", sorted(requirements)])
    key = hashlib.sha256(doc.encode()).hexdigest()[:12]
    return f"{runner}-cp{python.replace('.', '')}-{key}"


class CompilerReport(TypedDict):
    """What the factory's compiler wrappers did in one build: the ``compilers`` entry of the
    inside script's report (``inside/build.py``, ``compiler_summary``)."""

    narrowed: int  # calls whose targets outside the cell's archs were dropped
    injected: int  # calls that named no arch and were given the cell's
    std_raised: int  # calls given torch's C++ standard
    asked_archs: list[int]  # what the package asked for
    compiled_archs: list[int]  # what nvcc compiled
    refused: str | None  # why a compile left with no arch of the cell was refused


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    exit_code: int
    oom_killed: bool  # any process of the build was killed for memory (not just "exit != 0")
    oom_kill_count: int | None  # the cgroup's oom_kill counter, when readable
    wheel: Path | None  # the raw wheel in out_dir, when the build produced one
    compile_peak_rss_bytes: int | None  # peak sum of RSS over compiler processes (sampled)
    max_concurrent_compiles: int | None  # most compile jobs alive at one sample
    cgroup_peak_bytes: int | None  # the cgroup's own peak (includes page cache!)
    cgroup_anon_peak_bytes: int | None  # peak anonymous memory of the cgroup (sampled)
    wall_seconds: float
    objects_total: int | None  # from ninja's [N/M] lines
    objects_built: int | None
    log_path: Path
    timed_out: bool = False
    # output path of each compile job (nvcc -o) -> the peak RSS of its process tree (sampled)
    object_peak_rss_bytes: Mapping[str, int] | None = None
    # when the compile cache was on: whole objects from its direct layer (ccache), or sccache's
    # steps where sccache ran alone; sccache_hits: sccache's steps in either case
    cache_hits: int | None = None
    cache_misses: int | None = None
    sccache_hits: int | None = None
    # CPU seconds the build's cgroup used while compilers ran (the sampler's cgroup reads)
    compile_cpu_seconds: float | None = None
    runner: str = ""
    report: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # inside.py's raw report

    @property
    def compilers(self) -> CompilerReport | None:
        """What the factory's compiler wrappers did; None: the build ran without them."""
        found = self.report.get("compilers")
        return cast("CompilerReport", found) if isinstance(found, dict) else None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.wheel is not None and not self.oom_killed

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["wheel"] = str(self.wheel) if self.wheel else None
        d["log_path"] = str(self.log_path)
        return d


class Runner(Protocol):
    name: str
    # False: the build uses the interpreter's own packages and installs nothing (the local
    # runner's system-site and existing modes), so no wheelhouse is made for it.
    needs_wheelhouse: bool

    def start(self) -> None:
        """Once before a batch of builds (not for --dry-run): fail now when this runner cannot
        run here (EngineError), and clear what builds of a killed factory left behind."""
        ...

    def prepare(self, job: BuildJob) -> None:
        """Once per cell, before its first attempt: make what ``run`` needs besides the job's
        own files (the docker runner: its builder image)."""
        ...

    def run(self, job: BuildJob, *, on_line: LineCallback | None = None) -> RunResult:
        """Build; never raises for a failed or OOM-killed build (the result says so), only for
        a runner that cannot run at all (EngineError)."""
        ...

    def describe(self, job: BuildJob) -> dict[str, Any]:
        """The exact settings the run would use (for --dry-run), without running anything."""
        ...


INSIDE_PACKAGE = Path(__file__).with_name("inside")
INSIDE_SCRIPT_NAME = "inside.pyz"
_INSIDE_MAIN = "from inside.build import run_main\nimport sys\nrun_main(sys.argv)\n"


def write_inside_script(run_dir: Path) -> Path:
    """The in-container build script (the ``inside`` package, stdlib only) as one zip archive
    any python3 runs: ``python3 inside.pyz job.json``. Written per run, so a build always runs
    the factory's own copy."""
    target = run_dir / INSIDE_SCRIPT_NAME
    with zipfile.ZipFile(target, "w") as zf:
        zf.writestr("__main__.py", _INSIDE_MAIN)
        for source in sorted(INSIDE_PACKAGE.glob("*.py")):
            zf.write(source, f"inside/{source.name}")
    return target


def prepare_run(job: BuildJob, *extra_dirs: Path) -> tuple[Path, Path]:
    """Make the job's output dirs; return (a fresh private run dir, the report path).

    The report sits next to the log (``<log>.report.json``) so it survives the run dir.
    """
    for d in (job.out_dir, job.log_path.parent, *extra_dirs):
        d.mkdir(parents=True, exist_ok=True)
    if job.cache_dir:
        job.cache_dir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=".factory-run-", dir=job.log_path.parent))
    report_path = job.log_path.with_name(job.log_path.name + ".report.json")
    report_path.unlink(missing_ok=True)
    events_path(job.log_path).unlink(missing_ok=True)
    return run_dir, report_path


def events_path(log_path: Path) -> Path:
    """The sampler's events beside a build log (runners/inside/sampling.py writes
    ``<log>.events.jsonl``): one JSON line per compile job started or ended, and memory
    samples."""
    return log_path.with_name(log_path.name + ".events.jsonl")


def read_report(path: Path) -> dict[str, Any]:
    """inside.py's report; {} when it never got to write one (killed, or failed to start)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def result_from_report(
    *,
    job: BuildJob,
    report: Mapping[str, Any],
    exit_code: int,
    oom_killed: bool,
    oom_kill_count: int | None,
    cgroup_peak_bytes: int | None,
    wall_seconds: float,
    timed_out: bool,
    runner: str,
) -> RunResult:
    """The runner-independent part of a result: the measurements inside.py reported."""
    wheel_name = report.get("wheel")
    wheel = job.out_dir / wheel_name if wheel_name and exit_code == 0 else None
    return RunResult(
        exit_code=exit_code,
        oom_killed=oom_killed,
        oom_kill_count=oom_kill_count,
        wheel=wheel if wheel and wheel.is_file() else None,
        compile_peak_rss_bytes=report.get("compile_peak_rss_bytes"),
        max_concurrent_compiles=report.get("max_concurrent_compiles"),
        object_peak_rss_bytes=report.get("object_peak_rss_bytes"),
        cgroup_peak_bytes=cgroup_peak_bytes,
        cgroup_anon_peak_bytes=report.get("cgroup_anon_peak_bytes"),
        wall_seconds=round(wall_seconds, 1),
        objects_total=report.get("objects_total"),
        objects_built=report.get("objects_built"),
        log_path=job.log_path,
        timed_out=timed_out,
        cache_hits=report.get("cache_hits"),
        cache_misses=report.get("cache_misses"),
        sccache_hits=report.get("sccache_hits"),
        compile_cpu_seconds=report.get("compile_cpu_seconds"),
        runner=runner,
        report=dict(report),
    )
