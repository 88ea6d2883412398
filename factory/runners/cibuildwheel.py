"""The cibuildwheel runner: cibuildwheel drives the build, in the factory's own offline image.

cibuildwheel drives its own container, so the caps travel in its ``container-engine``
``create_args`` (memory = memory-swap, cpus, network none, pids) and the wheelhouse, toolkit
and glibc sysroot are mounted read-only through the same args. torch is installed offline in
``before-build``; the build runs pypa/build with ``--no-isolation`` so it sees that torch.

The image: cibuildwheel runs any image that has its interpreter layout (measured with
cibuildwheel 4.3: ``/opt/python/cp3X-cp3X/bin/{python,pip}`` first on PATH, and
``/opt/python/cp39-cp39/bin/python`` for reading the environment) and pulls none that exists
locally. So a factory image (``factory-base:bookworm``, made offline) gets that layout in a
derived image, ``<image>-cibw``: a venv of the cell's Python at the cibuildwheel path. The
official manylinux images already have it and are used as they are on a builder with a
registry. The repair step is not cibuildwheel's: the factory repairs every runner's wheel on
the host (local version tag, torch pin, auditwheel with torch's and CUDA's libraries
excluded, the glibc floor), as it does for the docker runner.

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
from pathlib import Path
from typing import Any

from factory.engine import docker_client
from factory.errors import EngineError
from factory.planning.ninja_log import ninja_counts
from factory.process import run_command
from factory.runners.base import INSIDE, BuildJob, LineCallback, RunResult
from factory.runners.cache_config import SCCACHE_SUBDIR
from factory.runners.inside import toolkit
from factory.runners.oom import was_oom_killed
from factory.toolchain.cross import builder_platform
from factory.toolchain.python_image import ensure_builder_image
from factory.toolchain.sysroot import sysroot_env

WHEELHOUSE = "/factory/wheelhouse"
CUDA = "/factory/cuda"
CACHE = "/factory/cache"
TOOLKIT = "/factory/toolkit"  # the build's toolkit: the factory's compiler wrappers
LOG = "/factory/log"
# cibuildwheel's interpreter layout, made in a factory image (see the module doc).
LAYOUT_SCRIPT = """set -e
tag=cp{nodot}-cp{nodot}
python{python} -m venv /opt/python/$tag
mkdir -p /opt/python/cp39-cp39/bin
helper=/opt/python/cp39-cp39/bin/python
[ -e $helper ] || ln -s "$(command -v python3)" $helper
"""


def default_image() -> str:
    """cibuildwheel's own manylinux_2_28 image for this builder's CPU."""
    return f"quay.io/pypa/manylinux_2_28_{builder_platform()}"


def toolkit_dir(job: BuildJob) -> Path:
    """Where the build's toolkit is made on the host, beside the cell's build tree."""
    return job.src_dir.parent.resolve() / "toolkit-cibuildwheel"


def wrapped_toolkit(job: BuildJob) -> Path | None:
    """The build's toolkit on the host: links into the toolkit as the container mounts it
    (``CUDA``) and the factory's compiler wrappers, which run on cibuildwheel's interpreter
    for the cell; None without a mounted toolkit (an image's own: not wrapped)."""
    if job.compilers is None or job.cuda_home is None:
        return None
    nodot = job.python.replace(".", "")
    spec = {**job.compilers, "dir": str(toolkit_dir(job))}
    home, _ = toolkit.install(spec, real=job.cuda_home.resolve(), seen_as=Path(CUDA),
                              python=f"/opt/python/cp{nodot}-cp{nodot}/bin/python", log=None)
    return home


def build_identifier(python: str, machine: str) -> str:
    return "cp" + python.replace(".", "") + f"-manylinux_{machine}"


def _mem_arg(n: int) -> str:
    return f"{n // (1 << 20)}m"


def cibuildwheel_environment(
    job: BuildJob, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The CIBW_* variables for one job (the whole configuration: no pyproject edits). Native
    builds only: cibuildwheel builds for the CPU its containers run on."""
    machine = builder_platform()
    if job.cross_target is not None:
        raise EngineError(
            f"the cibuildwheel runner builds only for this builder's CPU ({machine}), "
            f"not {job.cross_target}",
            tip="cross-build the cell with a runner that cross-compiles (factory build --runner)",
        )
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
    if job.sysroot:
        create.append(f"--volume={job.sysroot.resolve()}:{INSIDE['sysroot']}:ro")
    inner: dict[str, str] = {**job.env, **sysroot_env(job.sysroot, INSIDE["sysroot"])}
    # Offline by construction: every pip call in the container reads the wheelhouse only.
    inner.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE})
    if job.cuda_home:
        inner["CUDA_HOME"] = CUDA
        inner["PATH"] = f"{CUDA}/bin:$PATH"
    nvcc = f"{CUDA if job.cuda_home else '/usr/local/cuda'}/bin/nvcc"
    if job.cache_dir:
        inner.update(
            {
                "SCCACHE_DIR": f"{CACHE}/{SCCACHE_SUBDIR}",
                "SCCACHE_CACHE_SIZE": job.cache_size,
                "PYTORCH_NVCC": f"sccache {nvcc}",
            }
        )
    else:
        inner["TORCH_NO_COMPILER_WRAPPER"] = "1"
    if job.compilers is not None and job.cuda_home:
        # the factory's nvcc and C++ wrappers (made on the host by wrapped_toolkit), as in the
        # other runners' builds
        create.append(f"--volume={toolkit_dir(job)}:{TOOLKIT}:ro")
        create.append(f"--volume={job.log_path.parent.resolve()}:{LOG}:rw")
        spec = job.inside_compilers(TOOLKIT, f"{LOG}/{job.log_path.name}.compilers.jsonl")
        assert spec is not None
        toolkit.environment(spec, home=Path(TOOLKIT), real=Path(CUDA),
                            cxx_wrapper=Path(TOOLKIT) / "bin" / toolkit.CXX_NAME,
                            nvcc_next=["sccache", nvcc] if job.cache_dir else [nvcc],
                            extra=inner, log_path=spec["log"], cxx=inner.get("CXX", "c++"))
        inner["PATH"] = f"{TOOLKIT}/bin:$PATH"
    env = {
        "CIBW_BUILD": build_identifier(job.python, machine),
        "CIBW_ARCHS_LINUX": machine,
        f"CIBW_MANYLINUX_{machine.upper()}_IMAGE": cibuildwheel_image(job.image or default_image()),
        "CIBW_CONTAINER_ENGINE": "docker; create_args: " + " ".join(shlex.quote(a) for a in create),
        "CIBW_ENVIRONMENT": " ".join(
            f"{k}={shlex.quote(v) if '$' not in v else _dq(v)}" for k, v in sorted(inner.items())
        ),
        "CIBW_BEFORE_BUILD": "pip install --no-index --find-links "
        + WHEELHOUSE
        + " "
        + " ".join(shlex.quote(r) for r in job.requirements),
        # pypa/build, as in every runner (the wheelhouse carries it)
        "CIBW_BUILD_FRONTEND": "build; args: --no-isolation"
        + ("" if job.check_build_requires else " --skip-dependency-check"),
        "CIBW_BUILD_VERBOSITY": "1",  # ninja's [N/M] lines
        # the factory repairs on the host (factory.wheels.finalize), as for every runner
        "CIBW_REPAIR_WHEEL_COMMAND_LINUX": "",
        "CIBW_TEST_SKIP": "*",
    }
    if base:
        env = {**base, **env}
    return env


def cibuildwheel_image(image: str) -> str:
    """The image cibuildwheel is pointed at: a factory image's ``-cibw`` twin (the layout
    cibuildwheel needs), any other image as it is."""
    return f"{image}-cibw" if image.startswith("factory-base:") else image


def ensure_cibuildwheel_image(image: str, python: str) -> str:
    """Make ``<image>-cibw`` (offline: a venv from the image's own Python, then a commit) unless
    it exists with this Python's interpreter; returns what cibuildwheel should run."""
    target = cibuildwheel_image(image)
    if target == image:
        return image
    # heavy: the docker SDK, imported when used
    from docker.errors import APIError, ImageNotFound

    client = docker_client()
    nodot = python.replace(".", "")
    label = f"org.factory.cibuildwheel.cp{nodot}"
    try:
        labels = (client.images.get(target).attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(label) == image_id(client, image):
            return target
    except ImageNotFound:
        pass
    script = LAYOUT_SCRIPT.format(python=python, nodot=nodot)
    container = client.containers.create(image, ["bash", "-c", script], user="0:0",
                                         network_disabled=True)
    try:
        container.start()
        status = container.wait(timeout=600)
        if int(status.get("StatusCode", 1)) != 0:
            tail = container.logs(tail=20).decode(errors="replace").strip()
            raise EngineError(f"making {target} from {image} failed", tip=tail)
        repo, _, tag = target.rpartition(":")
        container.commit(repository=repo, tag=tag,
                         changes=[f"LABEL {label}={image_id(client, image)}"])
    except APIError as exc:
        raise EngineError(f"making {target} from {image} failed: {exc}") from None
    finally:
        container.remove(force=True)
    return target


def image_id(client: Any, image: str) -> str:
    """The base's id: a remade base makes the twin stale."""
    # heavy: the docker SDK, imported when used
    from docker.errors import ImageNotFound

    try:
        return str(client.images.get(image).id).removeprefix("sha256:")[:12]
    except ImageNotFound:
        raise EngineError(f"image {image} does not exist",
                          tip="'factory image base' makes the factory's base image") from None


def _dq(value: str) -> str:
    # CIBW_ENVIRONMENT is bash-like: double quotes keep $PATH expandable inside the container.
    return '"' + value.replace('"', '\\"') + '"'


class CibuildwheelRunner:
    name = "cibuildwheel"
    needs_wheelhouse = True

    def start(self) -> None:
        """Nothing: cibuildwheel drives its own containers."""

    def prepare(self, job: BuildJob) -> None:
        """A factory image: the builder image, then its ``-cibw`` twin with cibuildwheel's
        interpreter layout (an official manylinux image is cibuildwheel's to get)."""
        image = job.image or default_image()
        if cibuildwheel_image(image) != image:
            ensure_builder_image(image)
            ensure_cibuildwheel_image(image, job.python)

    def describe(self, job: BuildJob) -> dict[str, Any]:
        return {
            "runner": self.name,
            "environment": cibuildwheel_environment(job),
            "command": [
                "cibuildwheel",
                "--platform",
                "linux",
                "--output-dir",
                str(job.out_dir.resolve()),
                ".",
            ],
            "cwd": str(job.src_dir),
        }

    def run(self, job: BuildJob, *, on_line: LineCallback | None = None) -> RunResult:
        wrapped_toolkit(job)
        env = cibuildwheel_environment(job, base=os.environ)
        job.out_dir.mkdir(parents=True, exist_ok=True)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        before = {p: p.stat().st_mtime for p in job.out_dir.glob("*.whl")}
        started = time.monotonic()
        # cibuildwheel builds only a package inside its working directory
        result = run_command(
            ["cibuildwheel", "--platform", "linux", "--output-dir", job.out_dir.resolve(), "."],
            cwd=job.src_dir,
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
            (int(m.group(1)), int(m.group(2)))
            for m in re.finditer(r"^\s*\[(\d+)/(\d+)\]", result.output, re.M)
        ]
        counted = ninja_counts(progress)  # setup.py's ninja runs, one per extension, add up
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
            objects_total=counted[1] or None,
            objects_built=counted[0] or None,
            log_path=job.log_path,
            runner=self.name,
            report={"oom_detection": "log"},
        )


__all__ = [
    "CibuildwheelRunner",
    "build_identifier",
    "cibuildwheel_environment",
]
