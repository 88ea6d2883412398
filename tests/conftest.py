"""Shared, expensive things, made once per session and kept between sessions under .cache/:
the docker engine, the offline base image, the cp311 wheelhouse (torch, ~3 GB), the CUDA 13.0
toolkit from PyPI, and one build venv with torch installed (the runners reuse it like an OOM
retry would). Set FACTORY_TEST_CACHE to put them elsewhere.

Two tiers: tests/unit/ (no docker, no network, no toolkit, no real installs) and
tests/integration/ (real docker, nvcc, servers on loopback, pip and uv); every test of the
second carries the `integration` marker. The helper modules next to this file (index_fixtures,
index_wheels, ops_builds, wheel_fixtures) serve both tiers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tools import example_toolkit, missing

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_CELL = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"


INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)


# The smallest valid matrix: one flash-attn cell (no [settings], no version line).
FLASH_ATTN_MATRIX = """
[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [["10.0"]]
python = ["3.11"]

[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]
"""


def cache_root() -> Path:
    return Path(os.environ.get("FACTORY_TEST_CACHE", REPO / ".cache" / "factory"))


def write_example_matrix(path: Path, *, work_dir: Path, store: Path | None = None,
                         archs: tuple[str, ...] = ("10.0",), runner: str | None = None,
                         package: str = "factory-example-ext",
                         source: Path = REPO / "tests" / "example_ext") -> Path:
    """A matrix with the bundled example cell only (one cell per arch in ``archs``), sharing
    the session's wheelhouse; ``package``/``source``: another torch extension in its place."""
    store_line = f'store = "{store}"\n' if store else ""
    runner_line = f'runner = "{runner}"\n' if runner else ""
    arch_sets = ", ".join(f'["{a}"]' for a in archs)
    path.write_text(f"""\
version = 1
[settings]
{store_line}{runner_line}wheelhouse = "{cache_root() / 'wheelhouse'}"
work-dir = "{work_dir}"
venv-dir = "{cache_root() / 'venvs'}"
[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [{arch_sets}]
python = ["3.11"]
[packages.{package}]
recipe = "torch-extension"
versions = ["0.1.0"]
source = "{source}"
""")
    return path


def _engine_up() -> Any | None:
    try:
        from factory.engine import docker_client

        return docker_client(timeout=30)
    except Exception:
        return None


@pytest.fixture(scope="session")
def docker_engine() -> Any:
    """A connected docker client; starts dockerd when it is installed and we are root."""
    client = _engine_up()
    if client is None and shutil.which("dockerd") and os.geteuid() == 0:
        log_path = cache_root() / "dockerd.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
        for _ in range(60):
            time.sleep(1)
            client = _engine_up()
            if client is not None:
                break
    if client is None:
        pytest.skip(
            "no docker engine: dockerd is not running and could not be started "
            "(needs docker.io and root)"
        )
    return client


@pytest.fixture(scope="session")
def base_image(docker_engine: Any) -> str:
    from factory.toolchain.images import ensure_base_image

    return ensure_base_image(work_dir=cache_root() / "work")


@pytest.fixture(scope="session")
def example_cell() -> Any:
    from factory.matrix.load import load_matrix

    return load_matrix(REPO / "matrix.toml").find(EXAMPLE_CELL)


@pytest.fixture(scope="session")
def wheelhouse_cp311(example_cell: Any) -> Path:
    from factory.toolchain.wheelhouse import prepare_wheelhouse

    return prepare_wheelhouse(example_cell, cache_root() / "wheelhouse")


@pytest.fixture(scope="session")
def cuda13_home() -> Path:
    return example_toolkit()


@pytest.fixture(scope="session")
def build_requirements(example_cell: Any) -> tuple[str, ...]:
    from factory.toolchain.wheelhouse import build_requirements as reqs

    return reqs(example_cell)


@pytest.fixture(scope="session")
def venv_root() -> Path:
    """The build venvs every test build shares (the matrices above point here too): torch
    installs once per requirement set, and the disk holds one 5 GB venv, not one per test."""
    d = cache_root() / "venvs"
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclasses.dataclass(frozen=True)
class ExampleBuild:
    """The bundled example cell as the README's main command builds it: docker, the glibc
    sysroot, published to ``store``. ``raw`` is the wheel before finalize (tags, pin, repair)."""

    matrix: Path
    store: Path
    wheel: Path
    raw: Path
    log: str


@pytest.fixture(scope="session")
def example_build(tmp_path_factory: pytest.TempPathFactory, base_image: str,
                  wheelhouse_cp311: Path, cuda13_home: Path) -> ExampleBuild:
    """One real default build of the example cell per session, in a fresh build tree (its
    toolkits beside it are the session's), with a fresh memory history: the tests that read a
    default build (the glibc floor, reproducibility, the aarch64 twin's x86_64 side, the real
    wheel's verify and finalize) share it instead of each compiling the same five objects."""
    root = tmp_path_factory.mktemp("example-build")
    (root / "toolkits").symlink_to(cache_root() / "toolkits")
    matrix = write_example_matrix(root / "matrix.toml", work_dir=root / "work",
                                  store=root / "store")
    proc = subprocess.run(
        [sys.executable, "-m", "factory", "build", EXAMPLE_CELL, "--matrix", str(matrix),
         "--out", str(root / "dist"), "--no-import-check", "--memory", "8g", "--publish"],
        capture_output=True, text=True, cwd=REPO, timeout=1800,
        env={**os.environ, "CI": "true", "FACTORY_MEMORY_HISTORY": str(root / "history.json")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (root / "dist").glob("*.whl")
    (raw,) = (root / "work" / EXAMPLE_CELL / "raw").glob("*.whl")
    return ExampleBuild(matrix=matrix, store=root / "store", wheel=wheel, raw=raw,
                        log=proc.stdout + proc.stderr)


@pytest.fixture
def no_leftover_containers(docker_engine: Any) -> Iterator[None]:
    """Fails a test that leaves a build container of this process behind, and removes those.
    Containers of other processes (other test runs, builds on this engine) are not ours."""
    from factory.runners.docker import LABEL, OWNER_LABEL, owner_token

    me = owner_token()
    yield
    left = [c for c in docker_engine.containers.list(all=True, filters={"label": LABEL})
            if c.labels.get(OWNER_LABEL) == me]
    for c in left:
        c.remove(force=True)
    assert not left, f"build containers left behind: {[c.name for c in left]}"


def write_tiny_cuda_ext(root: Path, *, torch_headers: bool) -> Path:
    """A one-kernel CUDA extension. Without torch headers a compile takes seconds (cache tests);
    with them, cc1plus needs a GB or more and about a minute (OOM and kill tests)."""
    root.mkdir(parents=True, exist_ok=True)
    if torch_headers:
        kernel = (
            "#include <torch/extension.h>\n"
            "__global__ void twice(float* x, int64_t n) {\n"
            "  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n"
            "  if (i < n) x[i] *= 2; }\n"
            "torch::Tensor run(torch::Tensor x) {\n"
            "  twice<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel());\n"
            "  return x; }\n"
            'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }\n'
        )
    else:
        kernel = (
            "#include <Python.h>\n#include <cuda_runtime.h>\n"
            "__global__ void twice(float* x, int n) {\n"
            "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }\n"
            'static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};\n'
            "PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&mod); }\n"
        )
    (root / "tiny.cu").write_text(kernel)
    (root / "setup.py").write_text(
        "from setuptools import setup\n"
        "from torch.utils.cpp_extension import BuildExtension, CUDAExtension\n"
        "setup(name='tiny-cuda-ext', version='0.1.0',\n"
        "      ext_modules=[CUDAExtension('tiny_cuda_ext._C', ['tiny.cu'],\n"
        "                                 extra_compile_args={'cxx': ['-std=c++20'],\n"
        "                                                     'nvcc': ['-std=c++20']})],\n"
        "      cmdclass={'build_ext': BuildExtension})\n"
    )
    return root


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A real headless Chromium (Debian's, with its chromedriver: no browser download), shared
    by the browser tests of the finder, the reports and the coverage page."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        missing("chromium and chromedriver not installed (docker/setup-host.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1100,900", "--hide-scrollbars"):
        options.add_argument(arg)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(autouse=True)
def _facts_from_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Matrices resolve against the shipped snapshot, never against whatever this machine's
    work dir cached last (tests that read indexes pass their facts or their own work dir)."""
    from factory.environment import FACTS_ENV

    monkeypatch.setenv(FACTS_ENV, "snapshot")


@pytest.fixture(autouse=True)
def _memory_history_outside_the_repo(tmp_path_factory: pytest.TempPathFactory,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds run by tests record into a throwaway memory history, never the shipped one."""
    if "FACTORY_MEMORY_HISTORY" not in os.environ:
        monkeypatch.setenv("FACTORY_MEMORY_HISTORY",
                           str(tmp_path_factory.getbasetemp() / "memory_history.json"))
