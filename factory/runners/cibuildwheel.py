"""The cibuildwheel runner: multi-Python builds in the official manylinux images.

cibuildwheel drives its own container, so the caps travel in its ``container-engine``
``create_args`` (memory = memory-swap, cpus, network none, pids) and the wheelhouse and toolkit
are mounted read-only through the same args. torch is installed offline in ``before-build``;
the build runs with ``--no-build-isolation`` so it sees that torch; the repair step excludes
torch's and CUDA's libraries, which the wheel must load from the user's torch.

What this runner cannot do that the docker runner does: read the container's OOMKilled flag
and cgroup counters (cibuildwheel removes its container), so OOM is read from the log
(``oom.was_oom_killed`` with the log as its only signal) and the memory figures are None.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Mapping
from typing import Any

from factory.build.compile_cache import SCCACHE_SUBDIR
from factory.process import run_command
from factory.runners.base import BuildJob, LineCallback, RunResult
from factory.runners.oom import was_oom_killed

DEFAULT_IMAGE = "quay.io/pypa/manylinux_2_28_x86_64"
WHEELHOUSE = "/factory/wheelhouse"
CUDA = "/factory/cuda"
CACHE = "/factory/cache"
# A torch extension links against these at run time from the installed torch / driver;
# bundling them would add gigabytes or fail (FIELD-NOTES 6).
AUDITWHEEL_EXCLUDES = (
    "libtorch.so",
    "libtorch_cpu.so",
    "libtorch_cuda.so",
    "libtorch_python.so",
    "libc10.so",
    "libc10_cuda.so",
    "libcudart.so.*",
    "libcuda.so.*",
)


def build_identifier(python: str) -> str:
    return "cp" + python.replace(".", "") + "-manylinux_x86_64"


def _mem_arg(n: int) -> str:
    return f"{n // (1 << 20)}m"


def cibuildwheel_environment(
    job: BuildJob, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The CIBW_* variables for one job (the whole configuration: no pyproject edits)."""
    create = ["--network=none"]
    if job.memory_limit_bytes:
        create += [
            f"--memory={_mem_arg(job.memory_limit_bytes)}",
            f"--memory-swap={_mem_arg(job.memory_limit_bytes)}",
        ]
    if job.cpus:
        create.append(f"--cpus={job.cpus:g}")
    if job.pids_limit:
        create.append(f"--pids-limit={job.pids_limit}")
    create.append(f"--volume={job.wheelhouse.resolve()}:{WHEELHOUSE}:ro")
    if job.cuda_home:
        create.append(f"--volume={job.cuda_home.resolve()}:{CUDA}:ro")
    if job.cache_dir:
        create.append(f"--volume={job.cache_dir.resolve()}:{CACHE}:rw")
    inner: dict[str, str] = dict(job.env)
    # Offline by construction: every pip call in the container reads the wheelhouse only.
    inner.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE})
    if job.cuda_home:
        inner["CUDA_HOME"] = CUDA
        inner["PATH"] = f"{CUDA}/bin:$PATH"
    if job.cache_dir:
        inner.update(
            {
                "SCCACHE_DIR": f"{CACHE}/{SCCACHE_SUBDIR}",
                "SCCACHE_CACHE_SIZE": job.cache_size,
                "PYTORCH_NVCC": f"sccache {CUDA if job.cuda_home else '/usr/local/cuda'}/bin/nvcc",
            }
        )
    else:
        inner["TORCH_NO_COMPILER_WRAPPER"] = "1"
    excludes = " ".join(f"--exclude {shlex.quote(x)}" for x in AUDITWHEEL_EXCLUDES)
    env = {
        "CIBW_BUILD": build_identifier(job.python),
        "CIBW_ARCHS_LINUX": "x86_64",
        "CIBW_MANYLINUX_X86_64_IMAGE": job.image or DEFAULT_IMAGE,
        "CIBW_CONTAINER_ENGINE": "docker; create_args: " + " ".join(shlex.quote(a) for a in create),
        "CIBW_ENVIRONMENT": " ".join(
            f"{k}={shlex.quote(v) if '$' not in v else _dq(v)}" for k, v in sorted(inner.items())
        ),
        "CIBW_BEFORE_BUILD": "pip install --no-index --find-links "
        + WHEELHOUSE
        + " "
        + " ".join(shlex.quote(r) for r in job.requirements),
        "CIBW_BUILD_FRONTEND": "pip; args: --no-build-isolation --no-index",
        "CIBW_BUILD_VERBOSITY": "1",  # ninja's [N/M] lines
        "CIBW_REPAIR_WHEEL_COMMAND_LINUX": (
            f"auditwheel repair {excludes} -w {{dest_dir}} {{wheel}}"
        ),
        "CIBW_TEST_SKIP": "*",
    }
    if base:
        env = {**base, **env}
    return env


def _dq(value: str) -> str:
    # CIBW_ENVIRONMENT is bash-like: double quotes keep $PATH expandable inside the container.
    return '"' + value.replace('"', '\\"') + '"'


class CibuildwheelRunner:
    name = "cibuildwheel"
    needs_wheelhouse = True

    def start(self) -> None:
        """Nothing: cibuildwheel drives its own containers."""

    def prepare(self, job: BuildJob) -> None:
        """Nothing: cibuildwheel gets its manylinux image itself."""

    def describe(self, job: BuildJob) -> dict[str, Any]:
        return {
            "runner": self.name,
            "environment": cibuildwheel_environment(job),
            "command": [
                "cibuildwheel",
                "--platform",
                "linux",
                "--output-dir",
                str(job.out_dir),
                str(job.src_dir),
            ],
        }

    def print_build_identifiers(self, job: BuildJob) -> list[str]:
        env = cibuildwheel_environment(job, base=os.environ)
        result = run_command(
            ["cibuildwheel", "--platform", "linux", "--print-build-identifiers", str(job.src_dir)],
            env=env,
            what="cibuildwheel --print-build-identifiers",
        )
        return [
            ln.strip()
            for ln in result.output.splitlines()
            if re.fullmatch(r"[a-z0-9]+-\w+", ln.strip())
        ]

    def run(self, job: BuildJob, *, on_line: LineCallback | None = None) -> RunResult:
        env = cibuildwheel_environment(job, base=os.environ)
        job.out_dir.mkdir(parents=True, exist_ok=True)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        before = {p: p.stat().st_mtime for p in job.out_dir.glob("*.whl")}
        started = time.monotonic()
        result = run_command(
            ["cibuildwheel", "--platform", "linux", "--output-dir", job.out_dir, job.src_dir],
            env=env,
            log_path=job.log_path,
            check=False,
            timeout=job.timeout,
        )
        if on_line is not None:
            for ln in result.output.splitlines():
                on_line(ln)
        new = [p for p in job.out_dir.glob("*.whl") if before.get(p) != p.stat().st_mtime]
        progress = [
            tuple(map(int, m.groups()))
            for m in re.finditer(r"^\s*\[(\d+)/(\d+)\]", result.output, re.M)
        ]
        return RunResult(
            exit_code=result.returncode,
            oom_killed=was_oom_killed(
                exit_code=result.returncode, own_cgroup=False, log_text=result.output
            ),
            oom_kill_count=None,
            wheel=new[0] if result.returncode == 0 and new else None,
            compile_peak_rss_bytes=None,
            max_concurrent_compiles=None,
            cgroup_peak_bytes=None,
            cgroup_anon_peak_bytes=None,
            wall_seconds=round(time.monotonic() - started, 1),
            objects_total=max((t for _, t in progress), default=None),
            objects_built=max((n for n, _ in progress), default=None),
            log_path=job.log_path,
            runner=self.name,
            report={"oom_detection": "log"},
        )


__all__ = [
    "AUDITWHEEL_EXCLUDES",
    "CibuildwheelRunner",
    "build_identifier",
    "cibuildwheel_environment",
]
