"""The bundled example cell built with the default settings installs where torch installs: its
binaries need no newer glibc than manylinux_2_28 (``auditwheel show`` says so, not only the
factory), and the wheel, installed from the served index into a Debian bullseye container
(glibc 2.31, older than the builder's 2.36) with torch from the offline wheelhouse, loads and
registers its CUDA kernels with torch's dispatcher there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, ExampleBuild

from factory.index.server import running_server

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RUNTIME_IMAGE = "factory-base:bullseye-py3.11"  # glibc 2.31 with the cell's Python
# Run on the old host: the library loads (every symbol it needs resolves against glibc 2.31)
# and each op has its CUDA kernel registered; calling one needs a GPU, this checks all else.
CHECK = r"""
import os, torch, factory_example_ext as ext
print("glibc", os.confstr("CS_GNU_LIBC_VERSION"))
for op in ("add", "scale", "relu", "square"):
    name = f"factory_example_ext::{op}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"), name
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"), name
try:
    ext.add(torch.ones(2), torch.ones(2))
except NotImplementedError as exc:
    assert "CPU" in str(exc)
else:
    raise AssertionError("a CPU tensor reached a CUDA-only op")
print("checks passed")
"""


@pytest.fixture(scope="module")
def runtime_image(docker_engine: Any) -> str:
    from factory.toolchain.python_image import ensure_builder_image

    return ensure_builder_image(RUNTIME_IMAGE)


def _auditwheel_floor(wheel: Path) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # torch's libraries are not on auditwheel's whitelist, so it calls the wheel "consistent
    # with linux_x86_64" and gives the floor of the symbol versions separately
    text = " ".join(out.stdout.split())
    m = re.search(r'(?:constrains the platform tag to|consistent with the following platform '
                  r'tag:) "manylinux_(\d+)_(\d+)_x86_64"', text)
    assert m, text
    return int(m.group(1)), int(m.group(2))


def test_default_build_installs_and_loads_on_glibc_2_31(
    example_build: ExampleBuild, wheelhouse_cp311: Path, runtime_image: str,
) -> None:
    # the session's default build of the example (docker, the sysroot, published)
    store, wheel = example_build.store, example_build.wheel
    assert wheel.name.endswith("-manylinux_2_28_x86_64.whl")
    assert "bullseye sysroot" in example_build.log
    assert "glibc floor reached: manylinux_2_" in example_build.log

    # auditwheel's own reading of the binaries, and the one the factory recorded
    assert _auditwheel_floor(wheel) <= (2, 28)
    manifest = json.loads(wheel.with_name(wheel.name + ".provenance.json").read_text())
    floor = manifest["floor"]
    assert floor["sysroot"] is True and floor["promised"] == "2.28"
    reached = tuple(int(x) for x in floor["reached"]["glibc"].split("."))
    assert reached <= (2, 28)
    verified = subprocess.run(
        [sys.executable, "-m", "factory", "index", "verify", "--store", str(store), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert verified.returncode == 0, verified.stderr
    (listed,) = json.loads(verified.stdout)["floors"]
    assert listed["wheel"] == wheel.name and listed["ok"]
    assert listed["glibc"] == floor["reached"]["glibc"]

    # the old host: pip from the served index (the wheel) and the wheelhouse (torch), offline.
    # The project's HTML page as find-links: the pip that CPython 3.11.2 bundles (23.0.1, also
    # Debian 12's) fails on the index's PEP 691 JSON pages ("TypeError: unhashable type: 'dict'"
    # reading dist-info-metadata), which is not what this test is about.
    with running_server(store) as server:
        page = f"{server.url}simple/factory-example-ext/"  # the combined index: one build here
        script = (
            "set -e; python3.11 -m venv /tmp/v; "
            "/tmp/v/bin/pip install -q --disable-pip-version-check --no-index "
            f"--find-links '{page}?format=text/html' "
            "--find-links /wheelhouse factory-example-ext; "
            f"cd /tmp && /tmp/v/bin/python -I -c '{CHECK}'"
        )
        out = docker_engine_run(runtime_image, script, wheelhouse_cp311)
    assert "glibc 2.31" in out, out
    assert "checks passed" in out, out


def docker_engine_run(image: str, script: str, wheelhouse: Path) -> str:
    """Run ``script`` in ``image`` on the host's network (the index listens on loopback)."""
    from factory.engine import docker_client

    client = docker_client(timeout=1800)
    container = client.containers.run(
        image, ["bash", "-c", script], detach=True, network_mode="host",
        volumes={str(wheelhouse.resolve()): {"bind": "/wheelhouse", "mode": "ro"}},
        environment={"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INPUT": "1"},
    )
    try:
        status = container.wait(timeout=1800)
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert int(status.get("StatusCode", 1)) == 0, logs[-4000:]
    return logs
