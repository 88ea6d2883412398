"""The catalog in the default matrix: causal-conv1d, mamba-ssm, torch-scatter and grouped-gemm for
the default torch/CUDA/sm_100 on x86_64 and aarch64, tagged and pinned like flash-attn, and
listed by `factory doctor`, the finder page and `factory request` like any package (those have no
package-specific code: what they list comes from the matrix and the index)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ops_builds import factory_cli, publish_build

from factory.index.pages import FINDER_KEY
from factory.matrix.load import load_matrix
from factory.store import open_store

REPO = Path(__file__).resolve().parents[2]
HOSTS = Path(__file__).parents[1] / "data" / "doctor"
CATALOG = {  # package -> version
    "causal-conv1d": "1.7.0",
    "mamba-ssm": "2.3.2.post1",
    "torch-scatter": "2.1.2",
    "grouped-gemm": "0.3.0",
}


def _cells(package: str) -> list:  # type: ignore[type-arg]
    return load_matrix(REPO / "matrix.toml").cells_of([package])


@pytest.mark.parametrize("package", sorted(CATALOG))
def test_each_new_package_has_the_default_cell_on_both_cpus(package: str) -> None:
    cells = _cells(package)
    version = CATALOG[package]
    dist = package.replace("-", "_")
    assert {pc.cell.id for pc in cells} == {
        f"{package}-{version}-torch2.14.1-cu130-sm100-cp311",
        f"{package}-{version}-torch2.14.1-cu130-sm100-cp311-aarch64",
    }
    wheels = {pc.wheel for pc in cells}
    assert wheels == {f"{dist}-{version}+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_{cpu}.whl"
                      for cpu in ("x86_64", "aarch64")}
    for pc in cells:
        assert pc.recipe.name == package and pc.sha256 and pc.source == "pypi"
        assert pc.variant == "cu130-torch2.14-sm100"


@pytest.fixture(scope="module")
def catalog_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default matrix's catalog cells, published as fake builds (named, tagged and pinned
    like real ones) into one store."""
    root = tmp_path_factory.mktemp("catalog")
    for package in CATALOG:
        for pc in _cells(package):
            publish_build(root / "store", root / "dist", pc)
    return root / "store"


def _fake_torch(root: Path) -> Path:
    pkg = root / "torch"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('__version__ = "2.14.1+cu130"\nfrom . import version\n')
    (pkg / "version.py").write_text('cuda = "13.0"\n')
    return root


def test_doctor_lists_every_package_of_the_index(catalog_store: Path, tmp_path: Path) -> None:
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the catalog's cells are cp311")
    r = factory_cli("doctor", "--index", str(catalog_store), "--nvidia-smi-output",
                    str(HOSTS / "b200.txt"), env={"PYTHONPATH": str(_fake_torch(tmp_path))})
    assert r.returncode == 0, r.stdout + r.stderr
    url = catalog_store.resolve().as_uri()
    for package in CATALOG:
        assert (f"pip install --extra-index-url {url}/cu130-torch2.14-sm100/simple/ {package}"
                in r.stdout), r.stdout


def test_the_finder_page_has_a_row_per_wheel(catalog_store: Path) -> None:
    page = open_store(str(catalog_store)).read(FINDER_KEY)
    assert page is not None
    text = page.decode()
    for package, version in CATALOG.items():
        assert text.count(f">{package}<") == 2, package  # x86_64 and aarch64
        assert f"{version}+cu130torch2.14sm100" in text


@pytest.mark.parametrize("package", sorted(CATALOG))
def test_request_answers_a_published_cell_with_its_install_line(
    catalog_store: Path, package: str
) -> None:
    r = factory_cli("request", f"{package}=={CATALOG[package]}", "--torch", "2.14.1", "--cuda",
                    "13.0", "--arch", "10.0", "--python", "3.11", "--store", str(catalog_store),
                    "--matrix", str(REPO / "matrix.toml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cu130-torch2.14-sm100/simple/" in r.stdout and package in r.stdout
