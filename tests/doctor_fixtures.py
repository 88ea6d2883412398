"""What the doctor tests of both tiers share: the recorded hosts (data/doctor/*.txt), `factory doctor`
through the real CLI with a fake torch on PYTHONPATH, and stores of fake builds to read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ops_builds import factory_cli, planned, publish_build, write_matrix

HOSTS = Path(__file__).parent / "data" / "doctor"


FA = "flash-attn==2.8.3.post2+cu130torch2.14"  # the exact pin of the default matrix's builds


def doctor(index: Path | str, host: str, torch: Path | None, *extra: str):  # type: ignore[no-untyped-def]
    """The real CLI on a recorded host, reading this interpreter with a fake torch."""
    env = {"PYTHONPATH": str(torch)} if torch else {}
    return factory_cli("doctor", "--index", str(index), "--nvidia-smi-output", str(HOSTS / host),
                       "--python", sys.executable, *extra, env=env)


def pip_line(url: str, requirement: str) -> str:
    """The doctor's pip line for this interpreter: the per-variant URL and the exact build."""
    return f"{sys.executable} -m pip install --extra-index-url {url} {requirement}\n"


PY = f"3.{sys.version_info.minor}"


def doctor_matrix(archs: str, *, torch: str = '"2.14.1"', plat_python: str = PY) -> str:
    return f"""\
version = 1
[axes]
torch = [{torch}]
cuda = ["13.0"]
archs = {archs}
python = ["{plat_python}"]
[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]
"""


def doctor_store(tmp_path: Path, name: str, archs: str, **kwargs: str) -> Path:
    """A store (which holds its own index pages) with one fake build per cell of the matrix."""
    root = tmp_path / name
    root.mkdir()
    plat = kwargs.pop("plat", "manylinux_2_28_x86_64")
    for pc in planned(write_matrix(root, doctor_matrix(archs, **kwargs))):
        publish_build(root / "store", root / "dist", pc, plat=plat)
    return root / "store"


@pytest.fixture(scope="module")
def torch_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fake torch installs: one directory per kind, each meant for PYTHONPATH."""
    base = tmp_path_factory.mktemp("torch")
    kinds = {
        "2.14-cu130": '__version__ = "2.14.1+cu130"\nfrom . import version\n',
        "2.11-cu130": '__version__ = "2.11.0+cu130"\nfrom . import version\n',
        "2.14-cu128": '__version__ = "2.14.1+cu128"\nfrom . import version\n',
        "broken": 'raise OSError("libcudart.so.13: cannot open shared object file")\n',
    }
    out = {}
    for kind, init in kinds.items():
        pkg = base / kind / "torch"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(init)
        cuda = "12.8" if kind.endswith("cu128") else "13.0"
        (pkg / "version.py").write_text(f"cuda = {cuda!r}\n")
        out[kind] = base / kind
    return out


@pytest.fixture(scope="module")
def sm90_and_sm100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return doctor_store(tmp_path_factory.mktemp("idx"), "both", '[["9.0"], ["10.0"]]')
