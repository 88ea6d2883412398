"""One run of a build job: interpreter, requirements, environment, the wheel, the report.

Steps: make or reuse a venv, install the requirements offline from the wheelhouse (skipped when
the same set is already installed: OOM retries reuse it), put the factory's compiler wrappers in
front of the toolkit, then pypa/build (``python -m build --wheel --no-isolation``) in the source
tree with the recipe's environment. All output goes to the log file and stdout as it comes; the
compiler process tree's memory is sampled every ~0.5 s; a JSON report is written at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import toolkit
from .cache import CacheRun
from .cross import prepare_target
from .fault import OomFault
from .interpreter import prepare_interpreter, venv_lock
from .log import Log
from .sampling import CgroupReader, Sampler
from .steps import clean_env, run_step, stopping, terminate, watch_stdin

NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")


class Build:
    """One run of the job: its steps, and the report they fill in (written even when a step
    fails or the runner goes away)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.log = Log(job["log"])
        self.started = time.monotonic()
        self.report: dict[str, Any] = {
            "version": 1,
            "cell": job.get("cell_id"),
            "exit_code": None,
            "phase": "start",
        }
        self.cgroup: CgroupReader | None = None
        self.code = 1
        self.cache: CacheRun | None = None
        self.compiler_log: str | None = None

    def run(self) -> int:
        job, log = self.job, self.log
        # 1-2. the interpreter and the requirements (another build may share the venv: lock it).
        with venv_lock(job.get("venv")):
            self.code, python, path_prefix = prepare_interpreter(job, log, self.report)
            cross_env: dict[str, str] = {}
            if self.code == 0 and job.get("cross"):
                self.code, cross_env = prepare_target(job["cross"], python, log, self.report,
                                                      cuda_home=job.get("cuda_home"))
        if self.code != 0:
            return self.code
        # 3. the build environment.
        extra = self.environment(python, path_prefix, cross_env)
        if extra is None:
            self.code = 2
            return self.code
        env = clean_env(extra)
        if self.cache is not None:
            self.code = self.cache.start(env)
            if self.code != 0:
                return self.code
        # 4. the wheel.
        self.build_wheel(python, env, extra)
        return self.code

    def environment(
        self, python: str, path_prefix: list[str], cross_env: dict[str, str]
    ) -> dict[str, str] | None:
        """The recipe's variables, a cross build's compilers, the compile cache and the
        factory's compiler wrappers on top of ours; None when the cache is on but sccache is
        missing."""
        job = self.job
        extra = {**dict(job.get("env", {})), **cross_env}
        real = toolkit.toolkit_root(job.get("cuda_home"))
        compilers = job.get("compilers")
        if compilers and not (real / "bin" / toolkit.NVCC_NAME).exists():
            self.log.line(f"factory: no nvcc at {real / 'bin'}: the compiler wrappers are off")
            compilers = None
        home = cxx_wrapper = None
        if compilers:
            home, cxx_wrapper = toolkit.install(compilers, real=real, python=_wrapper_python(),
                                                log=self.log)
        if compilers or job.get("cuda_home"):
            path_prefix.append(str((home or real) / "bin"))
        extra["PATH"] = os.pathsep.join([*path_prefix, os.environ.get("PATH", "/usr/bin:/bin")])
        if job.get("cuda_home"):
            extra["CUDA_HOME"] = str(real)
        nvcc_next: list[str] = []
        cache = job.get("cache")
        if not cache:
            # A ccache/sccache that happens to be on PATH must not change what is built.
            extra["TORCH_NO_COMPILER_WRAPPER"] = "1"
        else:
            self.cache = CacheRun(cache, self.log)
            if not self.cache.environment(str(real / "bin" / toolkit.NVCC_NAME), extra):
                return None
            nvcc_next = self.cache.nvcc
        if compilers and home is not None and cxx_wrapper is not None:
            self.compiler_log = compilers["log"]
            Path(self.compiler_log).unlink(missing_ok=True)
            toolkit.environment(compilers, home=home, cxx_wrapper=cxx_wrapper, real=real,
                                nvcc_next=nvcc_next, extra=extra, log_path=self.compiler_log)
        elif nvcc_next:
            # no wrappers (a job without a cell's archs): the cache straight in front of nvcc
            extra["PYTORCH_NVCC"] = " ".join(nvcc_next)
        return extra

    def frontend(self, python: str, out_dir: Path) -> list[str]:
        """pypa/build, offline, in the prepared venv (``--no-isolation``: the build sees the
        venv's torch); ``-x`` where the recipe says the sdist's build requirements pin what the
        cell decides."""
        argv = [python, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out_dir)]
        if not self.job.get("check_build_requires", True):
            argv.append("--skip-dependency-check")
        return [*argv, "."]

    def build_wheel(self, python: str, env: dict[str, str], extra: dict[str, str]) -> None:
        """The build frontend in the source tree while the sampler watches its compilers."""
        job, log, report = self.job, self.log, self.report
        out_dir = Path(job["out"])
        out_dir.mkdir(parents=True, exist_ok=True)
        before = {p.name: p.stat().st_mtime for p in out_dir.glob("*.whl")}
        report["phase"] = "build"
        if run_step([python, "-c", "import build"], env=env, cwd=None, log=log) != 0:
            log.line("factory: the build interpreter has no pypa/build: install 'build' into it "
                     "(the wheelhouse carries it for the factory's venvs)")
            self.code = 2
            return
        sampler = Sampler(set(), self.cgroup, float(job.get("sample_interval", 0.5)),
                          events=job["log"] + ".events.jsonl")
        if self.cache is not None:
            # The server daemonizes (its parent is init): its compilers are found through it.
            sampler.roots.update(self.cache.servers())
        # setup.py runs ninja once per extension (torch-scatter: 8 runs), each counting its
        # own objects from 1: a count that does not go up starts a new run; the runs add up
        # (as planning.ninja_log.NinjaCount counts them: this script runs stdlib only)
        progress = {"built": 0, "total": 0, "run_built": 0, "run_total": 0}

        fault = OomFault.from_env(extra, sampler, log)

        def on_line(text: str) -> None:
            m = NINJA_PROGRESS.match(text.strip())
            if m:
                n, total = int(m.group(1)), int(m.group(2))
                if n <= progress["run_built"]:
                    progress["built"] += progress["run_built"]
                    progress["total"] += progress["run_total"]
                    progress["run_built"] = progress["run_total"] = 0
                progress["run_built"], progress["run_total"] = n, max(total, progress["run_total"])
                if fault is not None:
                    fault.maybe_fire(progress["built"] + progress["run_built"])

        def on_start(pid: int) -> None:
            sampler.roots.add(pid)
            sampler.start()

        t0 = time.monotonic()
        self.code = run_step(
            self.frontend(python, out_dir), env=env, cwd=job["src"], log=log,
            on_start=on_start, on_line=on_line,
        )
        if sampler.is_alive():
            sampler.stop()
        if fault is not None:
            fault.stop()
            report["fault_oom_fired"] = fault.fired
        report["build_seconds"] = round(time.monotonic() - t0, 1)
        report["compile_peak_rss_bytes"] = sampler.peak_rss
        report["compile_cpu_seconds"] = sampler.compile_cpu_seconds
        report["max_concurrent_compiles"] = sampler.peak_jobs
        report["object_peak_rss_bytes"] = sampler.object_peaks
        report["cgroup_anon_peak_bytes"] = sampler.peak_anon
        report["samples"] = sampler.samples
        report["stopped_at_oom_kill"] = sampler.oom_stopped
        report["objects_built"] = progress["built"] + progress["run_built"] or None
        report["objects_total"] = progress["total"] + progress["run_total"] or None
        after = [p for p in out_dir.glob("*.whl") if before.get(p.name) != p.stat().st_mtime]
        report["wheel"] = after[0].name if self.code == 0 and after else None

    def finish(self) -> None:
        """Cache and compiler figures and cgroup counters into the report; write it."""
        report = self.report
        if self.cache is not None:
            self.cache.finish(report, os.environ.get("PATH", ""))
        if self.compiler_log:
            report["compilers"] = compiler_summary(self.compiler_log)
        cgroup = self.cgroup
        if cgroup is not None and cgroup.path is not None:
            report["cgroup_version"] = cgroup.version
            report["cgroup_peak_bytes"] = cgroup.peak()
            report["oom_kill_count"] = cgroup.oom_kills()
            report["memory_limit_bytes"] = cgroup.limit()
        report["interrupted"] = stopping.is_set()
        report["exit_code"] = 143 if stopping.is_set() and self.code == 0 else self.code
        report["wall_seconds"] = round(time.monotonic() - self.started, 1)
        tmp = Path(self.job["report"] + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.job["report"])
        self.log.line(f"factory: exit {report['exit_code']} after {report['wall_seconds']} s")


def compiler_summary(path: str) -> dict[str, Any]:
    """What the compiler wrappers did, from their log: calls narrowed (and the archs asked for
    and compiled), given the cell's archs, given a raised C++ standard, refused."""
    out: dict[str, Any] = {"narrowed": 0, "injected": 0, "std_raised": 0, "asked_archs": [],
                           "compiled_archs": [], "refused": None}
    asked: set[int] = set()
    compiled: set[int] = set()
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("refused"):
            out["refused"] = out["refused"] or rec["refused"]
            continue
        if rec.get("dropped"):
            out["narrowed"] += 1
        if rec.get("injected"):
            out["injected"] += 1
        if rec.get("std"):
            out["std_raised"] += 1
        asked.update(int(a) for a in rec.get("asked", []))
        compiled.update(int(a) for a in rec.get("compiled", []))
    out["asked_archs"], out["compiled_archs"] = sorted(asked), sorted(compiled)
    return out


def _wrapper_python() -> str:
    """The interpreter the compiler wrappers run on: the one running this build script (the
    builder image's python3, or the factory's own on the local runner): stdlib only."""
    return sys.executable


def main(argv: list[str]) -> int:
    job: dict[str, Any] = json.loads(Path(argv[1]).read_text())
    build = Build(job)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, terminate)
    if job.get("watch_stdin"):
        threading.Thread(target=watch_stdin, args=(build.log,), daemon=True).start()
    build.cgroup = CgroupReader() if job.get("read_cgroup", True) else None
    try:
        return build.run()
    finally:
        build.finish()


def run_main(argv: list[str]) -> None:
    """The script's entry: run, then exit at once (the stdin watcher may still be blocked in
    read())."""
    status = main(argv)
    sys.stdout.flush()
    os._exit(status)
