"""What the local runner's tests of both tiers share: a probe package with an in-tree PEP 517
backend, its BuildJob, and a skip where no cgroup can be made."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from factory.errors import EngineError
from factory.runners import BuildJob, local


def probe_package(root: Path, build_body: str = "") -> Path:
    """A package with an in-tree PEP 517 backend: builds with no setuptools or wheel installed
    (``build_body`` runs first: a memory hog, a long child process)."""
    src = root / "src"
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (src / "backend.py").write_text(
        "import os, zipfile\n"
        "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
        + textwrap.indent(textwrap.dedent(build_body) or "pass\n", "    ")
        + "    name = 'probe-0.1-py3-none-any.whl'\n"
        "    with zipfile.ZipFile(os.path.join(wheel_directory, name), 'w') as z:\n"
        "        z.writestr('probe.py', 'VALUE = 1\\n')\n"
        "        z.writestr('probe-0.1.dist-info/METADATA',\n"
        "                   'Metadata-Version: 2.1\\nName: probe\\nVersion: 0.1\\n')\n"
        "        z.writestr('probe-0.1.dist-info/WHEEL',\n"
        "                   'Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
        "        z.writestr('probe-0.1.dist-info/RECORD', '')\n"
        "    return name\n"
    )
    return src


def probe_job(
    root: Path, src: Path, *, memory: int | None = 1 << 30, timeout: float | None = 300
) -> BuildJob:
    return BuildJob(
        cell_id="probe-0.1",
        python=f"{sys.version_info[0]}.{sys.version_info[1]}",
        src_dir=src,
        out_dir=root / "out",
        wheelhouse=root / "wheelhouse",
        cuda_home=None,
        requirements=(),
        memory_limit_bytes=memory,
        cpus=1,
        pids_limit=512,
        log_path=root / "logs" / "build.log",
        timeout=timeout,
    )


def cgroups_or_skip() -> None:
    try:
        cg = local.Cgroup.create(memory=1 << 30, cpus=None, pids=None)
    except EngineError as exc:
        pytest.skip(f"no writable cgroup here: {exc.message}")
    cg.remove()
