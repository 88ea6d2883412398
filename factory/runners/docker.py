"""The docker runner: one build in one throw-away container, driven by the docker SDK.

Caps: ``mem_limit`` equal to ``memswap_limit`` (no swap: a build over budget is OOM-killed, not
left to thrash the host), ``nano_cpus``, ``pids_limit``, and no network (torch and the build
deps come from the host's wheelhouse, mounted read-only like the toolkit).

Nothing outlives the factory: the container is removed in a ``finally`` (kept only with
FACTORY_KEEP_CONTAINER=1); SIGTERM is turned into an exception so that ``finally`` runs; for
SIGKILL, the container's stdin is attached with ``stdin_once``, so when this process dies the
engine closes it and the build script kills the build at once; the stopped container is labelled and
``cleanup_stale()`` removes it at the next run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from factory.engine import docker_client, image_exists
from factory.environment import KEEP_CONTAINER_ENV
from factory.errors import EngineError, raise_interrupted
from factory.planning import cgroup
from factory.runners.base import (
    INSIDE,
    INSIDE_SCRIPT_NAME,
    BuildJob,
    LineCallback,
    RunResult,
    prepare_run,
    read_report,
    result_from_report,
    write_inside_script,
)
from factory.runners.cache_config import inside_config
from factory.runners.oom import was_oom_killed
from factory.toolchain.cross import base_of_cross_image, ensure_cross_image
from factory.toolchain.images import make_command
from factory.toolchain.python_image import ensure_builder_image
from factory.toolchain.sysroot import sysroot_env

_log = logging.getLogger(__name__)

LABEL = "factory.build.pipeline"
OWNER_LABEL = "factory.owner"
CELL_LABEL = "factory.matrix.cell"
KEEP_ENV = KEEP_CONTAINER_ENV


# -- who owns a container ---------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks: with the pid, it names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[19]


def owner_token(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid) or '0'}"


def owner_alive(token: str) -> bool:
    host, _, rest = token.partition(":")
    pid_s, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_s.isdigit():
        # Another machine's builder shares this engine: its liveness is not ours to judge.
        return host != socket.gethostname()
    return _start_time(int(pid_s)) == start


def cleanup_stale(client: Any | None = None) -> list[str]:
    """Remove labelled build containers whose owner process is gone; return their names.

    Runs at the start of every docker build, so a factory killed with SIGKILL leaves nothing
    running for longer than until the next build (the build script has already stopped the compilers
    when its stdin closed; this removes the container itself).
    """
    client = client or docker_client()
    removed = []
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        token = container.labels.get(OWNER_LABEL, "")
        if token and owner_alive(token):
            continue
        if os.environ.get(KEEP_ENV) == "1" and container.status != "running":
            continue  # kept on purpose for debugging
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed.append(container.name)
    return removed


# -- the runner -------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-")[:48] or "build"


def _default_python(image: str, python: str) -> str:
    """The interpreter that makes the venv: manylinux images keep them in /opt/python."""
    if "manylinux" in image or "musllinux" in image:
        tag = "cp" + python.replace(".", "")
        return f"/opt/python/{tag}-{tag}/bin/python"
    # python3.X, not python3: an image with a second interpreter (factory.toolchain.python_image)
    # must build the cell's Python, and an image without it must fail, not build another.
    return f"python{python}"


class DockerRunner:
    name = "docker"
    needs_wheelhouse = True

    def __init__(
        self,
        *,
        client: Any | None = None,
        default_image: str = "factory-base:bookworm",
        python_executable: str | None = None,
        keep: bool | None = None,
    ) -> None:
        self._client = client
        self.default_image = default_image
        self.python_executable = python_executable
        self.keep = os.environ.get(KEEP_ENV) == "1" if keep is None else keep

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_client()
        return self._client

    # -- what the container looks like ----------------------------------------------------
    def _image(self, job: BuildJob) -> str:
        return job.image or self.default_image

    def inside_job(self, job: BuildJob) -> dict[str, Any]:
        """The job file the build script reads: every path is an inside path."""
        image = self._image(job)
        return {
            "cell_id": job.cell_id,
            "python": self.python_executable or _default_python(image, job.python),
            "venv": INSIDE["venv"],
            "system_site_packages": False,
            "requirements": list(job.requirements),
            "wheelhouse": INSIDE["wheelhouse"],
            "src": INSIDE["src"],
            "out": INSIDE["out"],
            "run_dir": INSIDE["run"],
            "log": f"{INSIDE['log']}/{job.log_path.name}",
            "report": f"{INSIDE['log']}/{job.log_path.name}.report.json",
            "env": {**job.env, **sysroot_env(job.sysroot, INSIDE["sysroot"])},
            "cuda_home": INSIDE["cuda"] if job.cuda_home else None,
            "cross": job.inside_cross(INSIDE["venv"], INSIDE["target_wheelhouse"]),
            "cache": (
                inside_config(root=INSIDE["cache"], size=job.cache_size, normalize_paths=True)
                if job.cache_dir else None
            ),
            "compilers": job.inside_compilers(
                f"{INSIDE['run']}/toolkit",
                f"{INSIDE['log']}/{job.log_path.name}.compilers.jsonl",
            ),
            "check_build_requires": job.check_build_requires,
            "watch_stdin": True,
            "read_cgroup": True,
            "sample_interval": 0.5,
        }

    def volumes(self, job: BuildJob, run_dir: Path | str) -> dict[str, dict[str, str]]:
        vols = {
            str(job.src_dir.resolve()): {"bind": INSIDE["src"], "mode": "rw"},
            str(job.out_dir.resolve()): {"bind": INSIDE["out"], "mode": "rw"},
            str(job.wheelhouse.resolve()): {"bind": INSIDE["wheelhouse"], "mode": "ro"},
            str(job.venv_for(self.name).resolve()): {"bind": INSIDE["venv"], "mode": "rw"},
            str(job.log_path.parent.resolve()): {"bind": INSIDE["log"], "mode": "rw"},
            str(run_dir): {"bind": INSIDE["run"], "mode": "rw"},
        }
        if job.cuda_home:
            # resolve(): a symlinked toolkit would dangle inside the container.
            vols[str(job.cuda_home.resolve())] = {"bind": INSIDE["cuda"], "mode": "ro"}
        if job.cache_dir:
            vols[str(job.cache_dir.resolve())] = {"bind": INSIDE["cache"], "mode": "rw"}
        if job.sysroot:
            vols[str(job.sysroot.resolve())] = {"bind": INSIDE["sysroot"], "mode": "ro"}
        if job.target_wheelhouse:
            vols[str(job.target_wheelhouse.resolve())] = {
                "bind": INSIDE["target_wheelhouse"], "mode": "ro"
            }
        return vols

    def create_kwargs(self, job: BuildJob, *, name: str, run_dir: Path | str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "image": self._image(job),
            "command": [
                self.python_executable or _default_python(self._image(job), job.python),
                f"{INSIDE['run']}/{INSIDE_SCRIPT_NAME}",
                f"{INSIDE['run']}/job.json",
            ],
            "name": name,
            "labels": {LABEL: "1", OWNER_LABEL: owner_token(), CELL_LABEL: job.cell_id},
            "network_disabled": True,
            "network_mode": "none",
            "volumes": self.volumes(job, run_dir),
            "working_dir": INSIDE["src"],
            "environment": {"HOME": INSIDE["run"], "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"},
            # Files in the source tree, venv and out dir stay owned by whoever runs the factory.
            "user": f"{os.getuid()}:{os.getgid()}",
            # docker-init as PID 1 forwards signals and reaps the compilers' zombies.
            "init": True,
            # stdin_open with detach=False is how the SDK sets StdinOnce: the engine closes the
            # container's stdin when the attached client (this process) goes away.
            "stdin_open": True,
            "detach": False,
        }
        if job.memory_limit_bytes:
            kwargs["mem_limit"] = job.memory_limit_bytes
            kwargs["memswap_limit"] = job.memory_limit_bytes  # equal: no swap at all
        if job.cpus:
            kwargs["nano_cpus"] = int(job.cpus * 1e9)
        if job.pids_limit:
            kwargs["pids_limit"] = job.pids_limit
        return kwargs

    def describe(self, job: BuildJob) -> dict[str, Any]:
        kwargs = self.create_kwargs(
            job, name=f"factory-build-{_slug(job.cell_id)}-XXXXXXXX", run_dir="<temporary run dir>"
        )
        kwargs["labels"] = {k: v for k, v in kwargs["labels"].items() if k != OWNER_LABEL}
        return {"runner": self.name, "container": kwargs, "inside_job": self.inside_job(job)}

    # -- running ----------------------------------------------------------------------------
    def start(self) -> None:
        """Reach the engine (EngineError when it is down) and remove stale build containers."""
        cleanup_stale(self.client)

    def prepare(self, job: BuildJob) -> None:
        """Make the builder image when it is missing. An image that brings its own toolkit
        (``cuda_home`` None: docker/Dockerfile.cuda) is the user's, used as it is: ``run``
        says so when it does not exist."""
        image = self._image(job)
        base = base_of_cross_image(image, job.cross_target) if job.cross_target else image
        if job.cuda_home is not None:
            ensure_builder_image(base)
        if job.cross_target:  # the base plus the target's cross compiler, made once
            ensure_cross_image(base, target=job.cross_target, python=job.python)

    def run(self, job: BuildJob, *, on_line: LineCallback | None = None) -> RunResult:
        client = self.client
        image = self._image(job)
        if not image_exists(client, image):
            raise EngineError(
                f"builder image {image} does not exist",
                tip=f"make it with '{make_command(image) or 'factory image base'}'",
            )
        for stale in cleanup_stale(client):
            _log.info(f"factory: removed stale build container {stale}")
        run_dir, report_path = prepare_run(job, job.venv_for(self.name))
        try:
            write_inside_script(run_dir)
            (run_dir / "job.json").write_text(json.dumps(self.inside_job(job), indent=2))
            name = f"factory-build-{_slug(job.cell_id)}-{uuid.uuid4().hex[:8]}"
            with _sigterm_as_interrupt(), self._container(job, name, run_dir) as container:
                return self._drive(container, job, report_path, on_line)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    @contextlib.contextmanager
    def _container(self, job: BuildJob, name: str, run_dir: Path) -> Iterator[Any]:
        # heavy: the docker SDK, imported when used
        from docker.errors import APIError

        try:
            container = self.client.containers.create(
                **self.create_kwargs(job, name=name, run_dir=run_dir)
            )
        except APIError as exc:
            raise EngineError(
                f"cannot create the build container: {exc.explanation or exc}"
            ) from None
        try:
            yield container
        finally:
            if self.keep:
                _log.info(f"factory: kept container {name} ({KEEP_ENV}=1)")
            else:
                with contextlib.suppress(Exception):
                    container.remove(force=True)

    def _drive(
        self, container: Any, job: BuildJob, report_path: Path, on_line: LineCallback | None
    ) -> RunResult:
        # Attach stdin before start: this socket is the build's lifeline (see module doc).
        lifeline = container.attach_socket(params={"stdin": 1, "stream": 1})
        started = time.monotonic()
        monitor: _CgroupMonitor | None = None
        streamer: threading.Thread | None = None
        timed_out = False
        try:
            container.start()
            container.reload()
            monitor = _CgroupMonitor(container.id)
            monitor.start()
            if on_line is not None:
                streamer = threading.Thread(
                    target=_stream_logs, args=(container, on_line), daemon=True
                )
                streamer.start()
            try:
                status = container.wait(timeout=job.timeout) if job.timeout else container.wait()
                exit_code = int(status.get("StatusCode", -1))
            except Exception as exc:  # requests' ReadTimeout / ConnectionError on timeout
                if (
                    "timed out" not in str(exc).lower()
                    and "timeout" not in type(exc).__name__.lower()
                ):
                    raise
                timed_out = True
                container.kill()
                exit_code = int(container.wait().get("StatusCode", -1))
        finally:
            with contextlib.suppress(Exception):
                lifeline.close()
            if monitor is not None:
                monitor.stop()
        wall = time.monotonic() - started
        container.reload()
        state = container.attrs.get("State", {})
        if streamer is not None:
            streamer.join(timeout=10)
        report = read_report(report_path)
        oom_count = report.get("oom_kill_count")
        peak = report.get("cgroup_peak_bytes")
        if monitor is not None:
            if monitor.oom_kills is not None:
                oom_count = max(oom_count or 0, monitor.oom_kills)
            if monitor.peak is not None:
                peak = max(peak or 0, monitor.peak)
        exit_code = int(state.get("ExitCode", exit_code))
        return result_from_report(
            job=job,
            report=report,
            exit_code=exit_code,
            oom_killed=was_oom_killed(
                exit_code=exit_code, own_cgroup=True,
                container_oom_killed=bool(state.get("OOMKilled")), oom_kills=oom_count,
            ),
            oom_kill_count=oom_count,
            cgroup_peak_bytes=peak,
            wall_seconds=wall,
            timed_out=timed_out,
            runner=self.name,
        )


def _stream_logs(container: Any, on_line: LineCallback) -> None:
    buf = b""
    with contextlib.suppress(Exception):
        for chunk in container.logs(stream=True, follow=True):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                on_line(ln.decode(errors="replace"))
    if buf:
        on_line(buf.decode(errors="replace"))


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _CgroupMonitor(threading.Thread):
    """The container's cgroup seen from the host, read while it exists: the engine deletes it
    when the container stops. A fallback for the build script's own figures, which are lost when
    the build script itself is the process the kernel kills."""

    def __init__(self, container_id: str) -> None:
        super().__init__(daemon=True)
        self.dirs = cgroup.container_dirs(container_id)
        self.peak: int | None = None
        self.oom_kills: int | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.read()
            self._stop_event.wait(1.0)

    def read(self) -> None:
        for d in self.dirs:
            peak = cgroup.memory_peak(d)
            if peak is not None:
                self.peak = max(self.peak or 0, peak)
            kills = cgroup.oom_kills(d)
            if kills is not None:
                self.oom_kills = max(self.oom_kills or 0, kills)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
