"""The declared Python floor runs: the project installed (not editable: a wheel in site-packages,
as on a GPU host) into a venv of the floor Python, 3.10, Ubuntu 22.04's `python3`, where hosts
run `factory doctor`. `factory --help` works there (tomllib's backport), the installed factory
finds matrix.toml from the working directory or FACTORY_MATRIX and says so in one line when there
is none, and the doctor reads a 3.10 host and prints its line."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, cache_root
from index_wheels import variant_wheel

from factory.index.publish import publish
from factory.store import LocalStore

pytestmark = [pytest.mark.integration, pytest.mark.download]

FLOOR = re.search(r'requires-python = ">=(\d+\.\d+)"',
                  (REPO / "pyproject.toml").read_text()).group(1)  # type: ignore[union-attr]


def _floor_python() -> str | None:
    """An interpreter of the floor version: on PATH, or pyenv's (the builders have it there)."""
    candidates = [shutil.which(f"python{FLOOR}"), f"/usr/bin/python{FLOOR}",
                  *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{FLOOR}.*/bin/"
                                                       f"python{FLOOR}")))]
    for exe in filter(None, candidates):
        try:
            r = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)
        except OSError:
            continue
        if r.returncode == 0 and r.stdout.strip() == FLOOR:
            return exe
    return None


def _project_copy(dest: Path) -> Path:
    """What pip builds the wheel from (pip builds in the tree: not in the checkout's)."""
    shutil.copytree(REPO / "factory", dest / "factory",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def floor_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = _floor_python()
    if exe is None:
        pytest.skip(f"no Python {FLOOR} here (pyenv or python{FLOOR} on PATH)")
    project = _project_copy(tmp_path_factory.mktemp("project"))
    venv = cache_root() / "floor-python" / f"py{FLOOR}"
    python = venv / "bin" / "python"
    if not (venv / ".deps").is_file():  # the dependencies once (PyPI), then only the project
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([exe, "-m", "venv", str(venv)], check=True)
        r = subprocess.run([str(python), "-m", "pip", "install", "-q", str(project)],
                           capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            pytest.skip(f"cannot install the project's dependencies: {r.stderr[-300:]}")
        (venv / ".deps").touch()
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                        "--force-reinstall", str(project)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return venv


def _run(venv: Path, *args: str, cwd: Path, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8",
             **(env or {})}
    return subprocess.run([str(venv / "bin" / "factory"), *args], cwd=cwd, env=clean,
                          capture_output=True, text=True, timeout=300)


def test_factory_help_runs_on_the_floor_python_from_an_installed_wheel(
    floor_venv: Path, tmp_path: Path
) -> None:
    r = _run(floor_venv, "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "FACTORY_STORE" in r.stdout and "doctor" in r.stdout
    where = subprocess.run([str(floor_venv / "bin/python"), "-c",
                            "import factory, sys; print(factory.__file__, sys.version_info[:2])"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "/site-packages/factory/" in where and str(REPO / "factory") not in where, where
    assert f"({FLOOR.replace('.', ', ')})" in where


def test_an_installed_factory_finds_the_matrix_or_says_where_to_put_it(
    floor_venv: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _run(floor_venv, "matrix", cwd=empty)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"ERROR no matrix.toml in {empty}",
        "TIP run in the directory that holds it, or pass --matrix FILE or set FACTORY_MATRIX",
    ]
    project = tmp_path / "project"
    project.mkdir()
    (project / "matrix.toml").write_text(
        'version = 1\n[axes]\ntorch = ["2.14.1"]\ncuda = ["13.0"]\narchs = [["10.0"]]\n'
        'python = ["3.11"]\n[packages.flash-attn]\nrecipe = "flash-attn"\n'
        'versions = ["2.8.3.post2"]\n')
    r = _run(floor_venv, "matrix", cwd=project)
    assert r.returncode == 0 and "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311" in r.stdout
    r = _run(floor_venv, "matrix", cwd=empty, env={"FACTORY_MATRIX": str(project / "matrix.toml")})
    assert r.returncode == 0 and "flash-attn-2.8.3.post2" in r.stdout, r.stderr


def test_the_doctor_on_a_floor_python_host(floor_venv: Path, tmp_path: Path) -> None:
    """Ubuntu 22.04's case: the doctor and the host's torch both on Python 3.10."""
    cp = "cp" + FLOOR.replace(".", "")
    store = LocalStore(tmp_path / "store")
    publish(store, [variant_wheel(tmp_path / "w", "flash-attn", "2.8.3.post2", "2.14",
                                  archs="100", tag=f"{cp}-{cp}-manylinux_2_28_x86_64")])
    torch = tmp_path / "torch" / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text('__version__ = "2.14.1+cu130"\nfrom . import version\n')
    (torch / "version.py").write_text('cuda = "13.0"\n')
    r = _run(floor_venv, "doctor", "--index", str(store.root), "--nvidia-smi-output",
             str(REPO / "tests/data/doctor/b200.txt"), cwd=tmp_path,
             env={"PYTHONPATH": str(torch.parent)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"python      {FLOOR} ({floor_venv / 'bin/python3'}: the python3 on PATH)" in r.stdout
    assert (f"flash_attn-2.8.3.post2+cu130torch2.14sm100-{cp}-{cp}-manylinux_2_28_x86_64.whl"
            in r.stdout)
    assert "python3 -m pip install --extra-index-url" in r.stdout

