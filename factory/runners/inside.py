"""The part of a build that runs inside the build container (or under the local runner's cgroup).

Standard library only: it runs on whatever python3 the builder image has, before anything is
installed. Usage: ``python3 inside.py JOB.json``; the job file is written by the runner.

Steps: make or reuse a venv, install the requirements offline from the wheelhouse (skipped when
the same set is already installed: OOM retries reuse it), then ``pip wheel`` in the source tree
with the recipe's environment. All output goes to the log file and stdout as it comes; the
compiler process tree's memory is sampled every ~0.5 s; a JSON report is written at the end.

When ``watch_stdin`` is set, end-of-file on stdin means the runner that started us is gone
(SIGKILL included: its end of the pipe or attach socket closes), and the build is killed at once,
so no compiler outlives the factory process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Processes whose memory is the compile's memory. "comm" is cut at 15 characters.
COMPILERS = {
    "nvcc",
    "cicc",
    "ptxas",
    "cudafe++",
    "fatbinary",
    "nvlink",
    "cc1plus",
    "cc1",
    "as",
    "ld",
    "ld.bfd",
    "ld.gold",
    "collect2",
    "g++",
    "gcc",
    "c++",
    "cc",
    "x86_64-linux-gn",
    "aarch64-linux-g",  # the cross compilers (comm is cut at 15 characters)
    "clang",
    "clang++",
    "lto-wrapper",
    "lto1",
    "bin2c",
}
# ... and the versioned drivers ('g++-12': what the glibc sysroot's wrapper runs)
VERSIONED_COMPILER = re.compile(r"^(?:g\+\+|gcc|c\+\+|cc|clang\+\+|clang)-\d+$")
NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
EVENT_SAMPLE_SECONDS = 2.0  # a memory sample in the events file at least this often

_current: subprocess.Popen[bytes] | None = None
_stopping = threading.Event()


class Log:
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "ab")  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._fh.write(data)
            self._fh.flush()
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except (BrokenPipeError, OSError):
                pass  # nobody is listening any more; the log file still has it

    def line(self, text: str) -> None:
        self.write((text + "\n").encode())


# -- process tree sampling --------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, comm, rss bytes) for every visible process."""
    table: dict[int, tuple[int, str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            with open(f"/proc/{entry}/statm", "rb") as fh:
                rss_pages = int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        lpar, rpar = stat.find("("), stat.rfind(")")
        comm = stat[lpar + 1 : rpar]
        fields = stat[rpar + 2 :].split()
        table[int(entry)] = (int(fields[1]), comm, rss_pages * PAGE)
    return table


def is_compiler(comm: str) -> bool:
    return comm in COMPILERS or VERSIONED_COMPILER.match(comm) is not None


def _output_of(pid: int) -> str | None:
    """The ``-o`` argument of a compiler's command line (the object it builds), if readable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i, arg in enumerate(args[:-1]):
        if arg == "-o":
            return args[i + 1]
    return None


def _descendants(table: dict[int, tuple[int, str, int]], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    stack = [r for r in roots if r in table]
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.add(pid)
        stack.extend(children.get(pid, ()))
    return out


class Sampler(threading.Thread):
    """Peak compiler RSS, concurrent compile jobs and the cgroup's anonymous memory. With an
    ``events`` file, one JSON line per compile job that starts or ends (by its ``-o``) and a
    memory sample every ``EVENT_SAMPLE_SECONDS``: what the host's progress and report read."""

    def __init__(self, roots: set[int], cgroup: CgroupReader | None, interval: float,
                 events: str | None = None) -> None:
        super().__init__(daemon=True)
        self._events = open(events, "a") if events else None  # noqa: SIM115
        self._live: dict[int, str] = {}  # job pid -> its output, as last announced
        self._last_sample = 0.0
        self.roots = roots
        self.cgroup = cgroup
        self.interval = interval
        self.peak_rss = 0
        self.peak_jobs = 0
        self.peak_anon: int | None = None
        self.object_peaks: dict[str, int] = {}  # output path (-o) -> peak RSS of its job
        self._outputs: dict[int, str | None] = {}  # job pid -> its output path
        self.samples = 0
        self.oom_stopped = False
        self._oom_base: int | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def sample(self) -> None:
        table = _proc_table()
        tree = _descendants(table, set(self.roots))
        compilers = {p for p in tree if is_compiler(table[p][1])}
        rss = sum(table[p][2] for p in compilers)
        job_rss: dict[int, int] = {}
        for pid in compilers:
            # A job is a compiler with no compiler above it (nvcc -> sh -> cicc is one job).
            parent, top = table[pid][0], pid
            while parent in tree:
                if parent in compilers:
                    top = parent
                parent = table[parent][0]
            job_rss[top] = job_rss.get(top, 0) + table[pid][2]
        jobs = len(job_rss)
        for pid, size in job_rss.items():
            out = self._outputs.get(pid) or _output_of(pid)  # None: not exec'd yet, ask again
            self._outputs[pid] = out
            if out:
                self.object_peaks[out] = max(size, self.object_peaks.get(out, 0))
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_jobs = max(self.peak_jobs, jobs)
        anon = None
        if self.cgroup is not None:
            anon = self.cgroup.anon()
            if anon is not None:
                self.peak_anon = max(self.peak_anon or 0, anon)
            self._stop_on_oom_kill()
        self.samples += 1
        if self._events is not None:
            self._emit_events(job_rss, rss, anon)

    def _emit_events(self, job_rss: dict[int, int], rss: int, anon: int | None) -> None:
        assert self._events is not None
        now = time.time()
        lines: list[dict[str, Any]] = []
        for pid in [p for p in self._live if p not in job_rss]:
            ended = self._live.pop(pid)
            lines.append({"t": now, "end": ended, "peak": self.object_peaks.get(ended, 0)})
        for pid in job_rss:
            out = self._outputs.get(pid)
            if out and pid not in self._live:
                self._live[pid] = out
                lines.append({"t": now, "start": out})
        if now - self._last_sample >= EVENT_SAMPLE_SECONDS or lines:
            self._last_sample = now
            lines.append({"t": now, "rss": rss, "anon": anon, "jobs": len(job_rss)})
        self._events.write("".join(json.dumps(line) + "\n" for line in lines))
        self._events.flush()

    def _stop_on_oom_kill(self) -> None:
        """At the first OOM kill, stop the whole build: ninja would wait for the other jobs,
        and under a cap they had just outgrown they thrash for minutes instead of finishing
        (seen with five jobs under 3-4 GiB). The retry resumes with fewer jobs anyway."""
        assert self.cgroup is not None
        kills = self.cgroup.oom_kills()
        if kills is None:
            return
        if self._oom_base is None:
            self._oom_base = kills
        elif kills > self._oom_base and not self.oom_stopped:
            self.oom_stopped = True
            _kill_current()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        self.sample()
        if self._events is not None:
            self._events.close()


# -- cgroup counters (v1 and v2) --------------------------------------------------------------
# The build's own view of its cgroup. The host's reads live in factory/planning/cgroup.py; this
# script cannot import them: it runs on the builder image's python, stdlib only, as one file.


def keyed(text: str | None, key: str) -> int | None:
    """The value of ``key`` in a cgroup 'key value' file (memory.stat, memory.events, ...)."""
    for ln in (text or "").splitlines():
        k, _, v = ln.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return None


class CgroupReader:
    """The memory cgroup this process is in. In a container the cgroup is mounted at the root of
    /sys/fs/cgroup even though /proc/self/cgroup names the host path, so both are tried."""

    def __init__(self) -> None:
        self.version = 0
        self.path: Path | None = None
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():
            rel = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), "/")
            for cand in (Path("/sys/fs/cgroup") / rel.lstrip("/"), Path("/sys/fs/cgroup")):
                if (cand / "memory.current").exists():
                    self.version, self.path = 2, cand
                    return
        for ln in lines:
            parts = ln.split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                base = Path("/sys/fs/cgroup/memory")
                for cand in (base / parts[2].lstrip("/"), base):
                    if (cand / "memory.usage_in_bytes").exists():
                        self.version, self.path = 1, cand
                        return

    def _read(self, name: str) -> str | None:
        if self.path is None:
            return None
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def _keyed(self, name: str, key: str) -> int | None:
        return keyed(self._read(name), key)

    def peak(self) -> int | None:
        text = self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def anon(self) -> int | None:
        if self.version == 2:
            return self._keyed("memory.stat", "anon")
        return self._keyed("memory.stat", "total_rss") or self._keyed("memory.stat", "rss")

    def oom_kills(self) -> int | None:
        if self.version == 2:
            return self._keyed("memory.events", "oom_kill")
        return self._keyed("memory.oom_control", "oom_kill")

    def limit(self) -> int | None:
        text = self._read("memory.max" if self.version == 2 else "memory.limit_in_bytes")
        return int(text) if text and text.strip().isdigit() else None


# -- running steps ----------------------------------------------------------------------------


def _kill_current() -> None:
    proc = _current
    if proc is None or proc.poll() is not None:
        return
    # Each step runs in its own process group: ninja, nvcc, cicc, ptxas all go together.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    log: Log,
    on_start: Any = None,
    on_line: Any = None,
) -> int:
    global _current
    if _stopping.is_set():
        return 143
    log.line("+ " + shlex.join(argv))
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    _current = proc
    if on_start:
        on_start(proc.pid)
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        log.write(raw)
        if on_line:
            on_line(raw.decode(errors="replace"))
    code = proc.wait()
    _current = None
    return code


def _watch_stdin(log: Log) -> None:
    try:
        # os.read, not sys.stdin: a daemon thread blocked in a buffered read aborts the
        # interpreter at exit.
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    if not _stopping.is_set():
        log.line("factory: the runner went away (stdin closed): stopping the build")
        _terminate()


def _terminate(*_: object) -> None:
    _stopping.set()
    _kill_current()


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    # The host's pip configuration (find-links, extra indexes, constraints) must not leak into
    # an offline build: only the wheelhouse counts.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        {
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
            "PIP_NO_CACHE_DIR": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def _sccache_stats(sccache: str, env: dict[str, str]) -> dict[str, Any]:
    try:
        out = subprocess.run(
            [sccache, "--show-stats", "--stats-format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        doc = json.loads(out)
        stats = doc.get("stats", {})
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}

    def total(key: str) -> int:
        value = stats.get(key, 0)
        if isinstance(value, dict):
            counts = value.get("counts", value)
            return sum(v for v in counts.values() if isinstance(v, int))
        return int(value) if isinstance(value, int) else 0

    hits, misses = total("cache_hits"), total("cache_misses")
    return {
        "cache_hits": hits,
        "cache_misses": misses,
        "sccache_hits": hits,
        "sccache_misses": misses,
        "compile_requests": total("compile_requests"),
        "sccache": doc,  # the whole document: factory.build.compile_cache parses it per step
    }


def _direct_stats(path: str) -> dict[str, int]:
    """ccache's stats log (``# <source>``, then one counter name per line, per compile) ->
    objects that hit, missed, or could not be cached."""
    counts = {"hits": 0, "misses": 0, "uncacheable": 0}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return counts
    records: list[set[str]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            records.append(set())
        elif line.strip() and records:
            records[-1].add(line.strip())
    for names in records:
        if names & {"direct_cache_hit", "preprocessed_cache_hit"}:
            counts["hits"] += 1
        elif "cache_miss" in names:
            counts["misses"] += 1
        else:
            counts["uncacheable"] += 1
    return counts


@contextlib.contextmanager
def _venv_lock(venv: str | None) -> Iterator[None]:
    """Builds that share a venv (two cells of one Python, a retry racing a stale run) must not
    create it or pip-install into it at the same time."""
    if not venv:
        yield
        return
    Path(venv).mkdir(parents=True, exist_ok=True)
    with open(Path(venv) / ".factory-lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _prepare_interpreter(
    job: dict[str, Any], log: Log, report: dict[str, Any]
) -> tuple[int, str, list[str]]:
    """A venv (reused across retries) or the given interpreter as it is; then the requirements,
    offline, skipped when a stamp says this set is installed (a retry saves the 40 s install).
    Returns (exit code, python, PATH entries to put first)."""
    python = job["python"]
    venv = job.get("venv")
    path_prefix: list[str] = []
    if venv:
        vpy = Path(venv) / "bin" / "python"
        if not vpy.exists():
            report["phase"] = "venv"
            args = [python, "-m", "venv"]
            if job.get("system_site_packages"):
                args.append("--system-site-packages")
            code = run_step([*args, venv], env=_clean_env({}), cwd=None, log=log)
            if code != 0:
                return code, python, path_prefix
        python = str(vpy)
        path_prefix.append(str(Path(venv) / "bin"))
    reqs = list(job.get("requirements", []))
    stamp = (Path(venv) if venv else Path(job["run_dir"])) / ".factory-requirements"
    key = hashlib.sha256(json.dumps(sorted(reqs)).encode()).hexdigest()
    if reqs and (not stamp.exists() or stamp.read_text().strip() != key):
        report["phase"] = "install"
        t0 = time.monotonic()
        code = run_step(
            [
                python,
                "-m",
                "pip",
                "install",
                "--no-index",
                "--find-links",
                job["wheelhouse"],
                *reqs,
            ],
            env=_clean_env({}),
            cwd=None,
            log=log,
        )
        report["install_seconds"] = round(time.monotonic() - t0, 1)
        if code != 0:
            return code, python, path_prefix
        stamp.write_text(key + "\n")
    return 0, python, path_prefix


def _toolkit_root(cuda_home: str | None) -> Path:
    """The CUDA toolkit torch's build will use, found the way torch.utils.cpp_extension finds it:
    the job's CUDA home, else CUDA_HOME / CUDA_PATH, else the nvcc on PATH, else /usr/local/cuda."""
    home = cuda_home or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = _which("nvcc", os.environ.get("PATH", ""))
    return Path(nvcc).parent.parent if nvcc else Path("/usr/local/cuda")


def _prepare_target(
    cross: dict[str, Any], python: str, log: Log, report: dict[str, Any],
    cuda_home: str | None = None,
) -> tuple[int, dict[str, str]]:
    """A cross build: unpack the target's torch and CUDA runtime (``pip install --target`` for
    the target's platform tags: no emulation), once per requirement set; return the build's
    environment (factory.toolchain.cross says why each variable)."""
    target = Path(cross["target_dir"])
    stamp = target / ".factory-target"
    key = hashlib.sha256(
        json.dumps([cross["requirements"], cross["pip_args"]], sort_keys=True).encode()
    ).hexdigest()
    if not stamp.exists() or stamp.read_text().strip() != key:
        report["phase"] = "target"
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=False)
        t0 = time.monotonic()
        code = run_step(
            [python, "-m", "pip", "install", "--no-index", "--find-links", cross["wheelhouse"],
             "--target", str(target), *cross["pip_args"], *cross["requirements"]],
            env=_clean_env({}), cwd=None, log=log,
        )
        report["target_install_seconds"] = round(time.monotonic() - t0, 1)
        if code != 0:
            return code, {}
        stamp.write_text(key + "\n")
    torch_include = target / "torch" / "include"
    includes = [torch_include, torch_include / "torch" / "csrc" / "api" / "include"]
    # CUDA 13 keeps thrust/cub/libcu++ in include/cccl, which nvcc adds from nvcc.profile for
    # its own target directory; with a cross -ccbin a system toolkit's nvcc did not (seen on the
    # GPU machine: torch's headers stop at thrust/complex.h), so it is named here
    cccl = _toolkit_root(cuda_home) / "include" / "cccl"
    if cccl.is_dir():
        includes.append(cccl)
    libs = [target / "torch" / "lib"]
    for cudart in sorted(target.glob("nvidia/*/lib/libcudart.so.*")):
        # the runtime wheels ship only libcudart.so.N; -lcudart needs the unversioned name
        link = cudart.with_name("libcudart.so")
        if not link.exists():
            link.symlink_to(cudart.name)
        libs.append(cudart.parent)
    env = dict(cross["env"])
    code, extra_include, sysconfig_dir = _target_python_config(python, target, env, log)
    if code != 0:
        return code, {}
    includes += extra_include
    if sysconfig_dir:
        env["PYTHONPATH"] = sysconfig_dir
    inc = " ".join(f"-I{d}" for d in includes)
    env.update({
        "CFLAGS": inc, "CXXFLAGS": inc, "NVCC_PREPEND_FLAGS": inc,
        "LDFLAGS": " ".join(f"-L{d}" for d in dict.fromkeys(libs)),
    })
    log.line(f"factory: cross build for {cross['target']}: target torch from {target}")
    return 0, env


# Run by the build's Python: where its stdlib and headers are, and its build-time variables.
_PY_CONFIG = """
import importlib, json, sys, sysconfig
name = sysconfig._get_sysconfigdata_name()
json.dump({"stdlib": sysconfig.get_path("stdlib"), "include": sysconfig.get_path("include"),
           "vars": importlib.import_module(name).build_time_vars}, sys.stdout)
"""
_X86_ONLY_FLAG = re.compile(r"^(-m\S+|-fcf-protection\S*)$")


def _target_python_config(
    python: str, target: Path, env: dict[str, str], log: Log
) -> tuple[int, list[Path], str | None]:
    """What the target's Python headers and sysconfig data would give, for build Pythons that do
    not ship them (Debian has them as multiarch packages, libpython3.X-dev:arm64; a pyenv or
    standalone Python, or a GPU box without the package, has only its own): a sysconfigdata
    module made from the build Python's, for the target's triplet and compilers, and the
    multiarch pyconfig.h that Debian's pyconfig.h dispatcher includes. Both CPUs are LP64
    little-endian Linux: the values that differ are the names this rewrites."""
    name = env["_PYTHON_SYSCONFIGDATA_NAME"]
    triplet = name.removeprefix("_sysconfigdata__")
    proc = subprocess.run([python, "-c", _PY_CONFIG], capture_output=True, text=True,
                          env=_clean_env({}))
    if proc.returncode != 0:
        log.line(f"factory: cannot read the build Python's configuration: {proc.stderr.strip()}")
        return proc.returncode, [], None
    info = json.loads(proc.stdout)
    extra_include: list[Path] = []
    header = Path(info["include"]) / "pyconfig.h"
    version = Path(info["include"]).name  # python3.11
    if header.is_file() and f"{triplet}/{version}/pyconfig.h" in header.read_text(errors="replace"):
        wanted = Path("/usr/include") / triplet / version / "pyconfig.h"
        if not wanted.is_file():
            own = next(Path("/usr/include").glob(f"*-linux-gnu/{version}/pyconfig.h"), None)
            if own is None:
                log.line(f"factory: {header} includes {wanted}, which is missing")
                return 1, [], None
            made = target / "_include" / triplet / version / "pyconfig.h"
            made.parent.mkdir(parents=True, exist_ok=True)
            made.write_text(own.read_text())
            extra_include.append(target / "_include")
            log.line(f"factory: no {wanted}: using {own} for {triplet}")
    if (Path(info["stdlib"]) / f"{name}.py").is_file():
        return 0, extra_include, None
    host_triplet = next((t for t in ("x86_64-linux-gnu", "aarch64-linux-gnu") if t != triplet), "")
    values = {}
    for key, value in info["vars"].items():
        if isinstance(value, str):
            value = value.replace(host_triplet, triplet)
            if "FLAGS" in key or key in ("OPT", "CONFIGURE_CFLAGS", "CFLAGSFORSHARED"):
                value = " ".join(t for t in value.split() if not _X86_ONLY_FLAG.match(t))
        values[key] = value
    # the compilers (with a glibc sysroot, the job's CC/CXX name its wrappers and win anyway)
    cc, cxx = env.get("CC", f"{triplet}-gcc"), env.get("CXX", f"{triplet}-g++")
    values.update({"CC": cc, "CXX": cxx, "LDSHARED": f"{cc} -shared",
                   "LDCXXSHARED": f"{cxx} -shared", "BLDSHARED": f"{cc} -shared",
                   "MULTIARCH": triplet})
    made_dir = target / "_sysconfig"
    made_dir.mkdir(parents=True, exist_ok=True)
    (made_dir / f"{name}.py").write_text(f"build_time_vars = {values!r}\n")
    log.line(f"factory: the build Python has no {name}: made one from its own for {triplet}")
    return 0, extra_include, str(made_dir)


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
        self.sccache: str | None = None  # the compile cache's sccache, once found
        self.sccache_env: dict[str, str] = {}
        self.direct_log: str | None = None  # ccache's stats log, when its direct layer is on

    def run(self) -> int:
        job, log = self.job, self.log
        # 1-2. the interpreter and the requirements (another build may share the venv: lock it).
        with _venv_lock(job.get("venv")):
            self.code, python, path_prefix = _prepare_interpreter(job, log, self.report)
            cross_env: dict[str, str] = {}
            if self.code == 0 and job.get("cross"):
                self.code, cross_env = _prepare_target(job["cross"], python, log, self.report,
                                                     cuda_home=job.get("cuda_home"))
        if self.code != 0:
            return self.code
        # 3. the build environment.
        extra = self.environment(path_prefix, cross_env)
        if extra is None:
            self.code = 2
            return self.code
        env = _clean_env(extra)
        if self.sccache:
            self.code = self.start_sccache(env)
            if self.code != 0:
                return self.code
        # 4. the wheel.
        self.build_wheel(python, env, extra)
        return self.code

    def environment(
        self, path_prefix: list[str], cross_env: dict[str, str]
    ) -> dict[str, str] | None:
        """The recipe's variables, a cross build's compilers, CUDA and the compile cache on top
        of ours; None when the cache is on but sccache is missing."""
        job = self.job
        cuda_home = job.get("cuda_home")
        extra = {**dict(job.get("env", {})), **cross_env}
        if cuda_home:
            extra["CUDA_HOME"] = cuda_home
            path_prefix.append(str(Path(cuda_home) / "bin"))
        extra["PATH"] = os.pathsep.join([*path_prefix, os.environ.get("PATH", "/usr/bin:/bin")])
        cache = job.get("cache")
        if not cache:
            # A ccache/sccache that happens to be on PATH must not change what is built.
            extra["TORCH_NO_COMPILER_WRAPPER"] = "1"
            return extra
        if not self.cache_environment(cache, cuda_home, extra):
            return None
        return extra

    def cache_environment(
        self, cache: dict[str, Any], cuda_home: str | None, extra: dict[str, str]
    ) -> bool:
        """Put sccache (and ccache's direct layer, when the image has it) in front of the
        compilers; False when sccache is not installed."""
        log = self.log
        self.sccache = _which("sccache", extra["PATH"])
        if self.sccache is None:
            log.line(
                "factory: the compile cache is on but sccache is not installed "
                "(it must be in the wheelhouse)"
            )
            return False
        self.sccache_env = {
            "SCCACHE_DIR": cache["dir"],
            "SCCACHE_CACHE_SIZE": cache["size"],
            # we stop the server ourselves; it must not outlive or pre-empt us
            "SCCACHE_IDLE_TIMEOUT": "0",
            "SCCACHE_SERVER_PORT": str(cache.get("port", 4226)),
        }
        extra.update(self.sccache_env)
        nvcc = str(Path(cuda_home) / "bin" / "nvcc") if cuda_home else "nvcc"
        # torch's cpp_extension takes PYTORCH_NVCC verbatim as the ninja nvcc command;
        # newer torch also puts sccache in front of the C++ compiler when it is on PATH.
        extra["PYTORCH_NVCC"] = f"{self.sccache} {nvcc}"
        # factory.build.compile_cache: the size bound, and compiler wrappers (nvcc, C++) that
        # spell paths the same for every Python version (so cp311 and cp313 share objects).
        self.sccache_env.update(cache.get("env", {}))
        extra.update(cache.get("env", {}))
        direct = cache.get("direct")
        if direct and _which("ccache", extra["PATH"]) is None:
            log.line("factory: ccache is not in the builder image: the compile cache runs "
                     "without its direct layer (hits cost a preprocessing pass); "
                     "remake the image to get it")
        elif direct:
            self.direct_log = direct["env"]["CCACHE_STATSLOG"]
            Path(self.direct_log).unlink(missing_ok=True)
            extra.update(direct["env"])
        if cache.get("nvcc_wrapper"):
            extra["PYTORCH_NVCC"] = _install_script(cache["nvcc_wrapper"])
        if cache.get("cxx_wrapper"):
            extra["FACTORY_HOST_CXX"] = extra.get("CXX") or os.environ.get("CXX") or "c++"
            extra["CXX"] = _install_script(cache["cxx_wrapper"])
            # the wrapper calls sccache itself: torch must not put another in front
            extra["TORCH_NO_COMPILER_WRAPPER"] = "1"
        return True

    def start_sccache(self, env: dict[str, str]) -> int:
        """A fresh server of our own, with zeroed stats (the report's hits are this build's)."""
        assert self.sccache is not None
        sccache = self.sccache
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, timeout=60)
        code = run_step([sccache, "--start-server"], env=env, cwd=None, log=self.log)
        if code != 0:
            return code
        subprocess.run([sccache, "--zero-stats"], env=env, capture_output=True, timeout=60)
        return 0

    def build_wheel(self, python: str, env: dict[str, str], extra: dict[str, str]) -> None:
        """``pip wheel`` in the source tree while the sampler watches its compilers."""
        job, log, report = self.job, self.log, self.report
        out_dir = Path(job["out"])
        out_dir.mkdir(parents=True, exist_ok=True)
        before = {p.name: p.stat().st_mtime for p in out_dir.glob("*.whl")}
        report["phase"] = "build"
        sampler = Sampler(set(), self.cgroup, float(job.get("sample_interval", 0.5)),
                          events=job["log"] + ".events.jsonl")
        if self.sccache:
            # The server daemonizes (its parent is init): its compilers are found through it.
            sampler.roots.update(_sccache_servers(self.sccache_env["SCCACHE_SERVER_PORT"]))
        progress = {"built": 0, "total": 0}

        fault = _OomFault.from_env(extra, sampler, log)

        def on_line(text: str) -> None:
            m = NINJA_PROGRESS.match(text.strip())
            if m:
                progress["built"] = max(progress["built"], int(m.group(1)))
                progress["total"] = max(progress["total"], int(m.group(2)))
                if fault is not None:
                    fault.maybe_fire(progress["built"])

        def on_start(pid: int) -> None:
            sampler.roots.add(pid)
            sampler.start()

        t0 = time.monotonic()
        # -v: without it pip hides the backend's output, and with it ninja's [N/M] lines.
        self.code = run_step(
            [
                python,
                "-m",
                "pip",
                "wheel",
                "--no-build-isolation",
                "--no-deps",
                "--no-index",
                "--find-links",
                job["wheelhouse"],
                "-v",
                "-w",
                str(out_dir),
                ".",
            ],
            env=env,
            cwd=job["src"],
            log=log,
            on_start=on_start,
            on_line=on_line,
        )
        if sampler.is_alive():
            sampler.stop()
        if fault is not None:
            fault.stop()
            report["fault_oom_fired"] = fault.fired
        report["build_seconds"] = round(time.monotonic() - t0, 1)
        report["compile_peak_rss_bytes"] = sampler.peak_rss
        report["max_concurrent_compiles"] = sampler.peak_jobs
        report["object_peak_rss_bytes"] = sampler.object_peaks
        report["cgroup_anon_peak_bytes"] = sampler.peak_anon
        report["samples"] = sampler.samples
        report["stopped_at_oom_kill"] = sampler.oom_stopped
        report["objects_built"] = progress["built"] or None
        report["objects_total"] = progress["total"] or None
        after = [p for p in out_dir.glob("*.whl") if before.get(p.name) != p.stat().st_mtime]
        report["wheel"] = after[0].name if self.code == 0 and after else None

    def finish(self) -> None:
        """Cache statistics and cgroup figures into the report; stop sccache; write the report."""
        report = self.report
        if self.sccache:
            report.update(
                _sccache_stats(
                    self.sccache,
                    _clean_env({**self.sccache_env, "PATH": os.environ.get("PATH", "")}),
                )
            )
        if self.direct_log:
            # The build's hits and misses are whole objects, as the direct layer answered them;
            # sccache's (its steps, on the direct layer's misses) stay in sccache_hits/_misses.
            direct_stats = _direct_stats(self.direct_log)
            report["direct_cache"] = direct_stats
            report["cache_hits"] = direct_stats["hits"]
            report["cache_misses"] = direct_stats["misses"]
        if self.sccache:
            subprocess.run(
                [self.sccache, "--stop-server"],
                env=_clean_env(self.sccache_env),
                capture_output=True,
                timeout=60,
            )
        cgroup = self.cgroup
        if cgroup is not None and cgroup.path is not None:
            report["cgroup_version"] = cgroup.version
            report["cgroup_peak_bytes"] = cgroup.peak()
            report["oom_kill_count"] = cgroup.oom_kills()
            report["memory_limit_bytes"] = cgroup.limit()
        report["interrupted"] = _stopping.is_set()
        report["exit_code"] = 143 if _stopping.is_set() and self.code == 0 else self.code
        report["wall_seconds"] = round(time.monotonic() - self.started, 1)
        tmp = Path(self.job["report"] + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.job["report"])
        self.log.line(f"factory: exit {report['exit_code']} after {report['wall_seconds']} s")


def main(argv: list[str]) -> int:
    job: dict[str, Any] = json.loads(Path(argv[1]).read_text())
    build = Build(job)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _terminate)
    if job.get("watch_stdin"):
        threading.Thread(target=_watch_stdin, args=(build.log,), daemon=True).start()
    build.cgroup = CgroupReader() if job.get("read_cgroup", True) else None
    try:
        return build.run()
    finally:
        build.finish()


class _OomFault:
    """Fault injection for tests (FACTORY_FAULT_OOM_AFTER=N in the build's env): once N
    objects are done, make the running compilers the OOM killer's first choice and fill
    memory until the cgroup kills them: a real OOM kill in the middle of a real build, so a
    test can check that the retry keeps the finished objects."""

    def __init__(self, after: int, sampler: Sampler, log: Log) -> None:
        self.after = after
        self.sampler = sampler
        self.log = log
        self.fired = False
        self.hog: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_env(cls, env: dict[str, str], sampler: Sampler, log: Log) -> _OomFault | None:
        value = env.pop("FACTORY_FAULT_OOM_AFTER", None)
        return cls(int(value), sampler, log) if value else None

    def maybe_fire(self, built: int) -> None:
        if self.fired or built < self.after:
            return
        self.fired = True
        table = _proc_table()
        victims = [p for p in _descendants(table, self.sampler.roots)
                   if is_compiler(table[p][1])]
        for pid in victims:
            try:
                with open(f"/proc/{pid}/oom_score_adj", "w") as fh:
                    fh.write("1000")
            except OSError:
                pass
        self.log.line(f"factory: fault injection: OOM after {built} object(s), "
                      f"{len(victims)} compiler process(es) marked")
        # touched pages (b"x" * n), not calloc'd ones, so the cgroup really fills up
        self.hog = subprocess.Popen(
            [sys.executable, "-c",
             "import time\nb = []\nwhile True:\n"
             "    b.append(b'x' * (32 << 20))\n    time.sleep(0.01)"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.hog is not None and self.hog.poll() is None:
            self.hog.kill()
            self.hog.wait()


def _install_script(spec: dict[str, str]) -> str:
    """Write an executable script (``{"path", "text"}``); returns its path."""
    Path(spec["path"]).write_text(spec["text"])
    os.chmod(spec["path"], 0o755)
    return spec["path"]


def _which(name: str, path: str) -> str | None:
    for d in path.split(os.pathsep):
        cand = Path(d) / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def _sccache_servers(port: str) -> set[int]:
    """Our sccache server: named sccache, started with our port (other builds use others)."""
    mine = f"SCCACHE_SERVER_PORT={port}".encode()
    found = set()
    for pid, (_, comm, _) in _proc_table().items():
        if comm != "sccache":
            continue
        try:
            if mine in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.add(pid)
        except OSError:
            continue
    return found


if __name__ == "__main__":
    status = main(sys.argv)
    sys.stdout.flush()
    os._exit(status)  # the stdin watcher may still be blocked in read()
