"""Wheel variants with the real uv (the release on PyPI, `--preview-features wheel-variants`):
one URL for every host, and uv picks the build for the GPU arch and CUDA driver its NVIDIA
provider reports (overridden here: the test hosts have no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from index_fixtures import installer_env, uv_bin
from index_wheels import make_wheel, variant_wheel

from factory.index.publish import publish
from factory.index.server import RunningServer, running_server
from factory.store import LocalStore
from factory.index.wheel_variants import label_wheel, properties, variants_doc, write_wheel_variants

pytestmark = pytest.mark.integration


def test_labels_and_properties() -> None:
    label, props = properties("fa-1.0+cu130torch2.14sm90.100-py3-none-any.whl", None) or ("", {})
    assert label == "cu130sm90.100"
    assert props == {
        "nvidia": {"cuda_version_lower_bound": ["13.0"], "sm_arch": ["90_real", "100_real"]}
    }
    # The package's default arch set, when the tag carries none; no tag: no variant.
    assert properties("fa-1.0+cu128torch2.14-py3-none-any.whl", (80, 90))[0] == "cu128sm80.90"  # type: ignore[index]
    assert properties("fa-1.0+cu128torch2.14-py3-none-any.whl", None) is None
    assert properties("fa-1.0-py3-none-any.whl", (80,)) is None
    long = properties("fa-1.0+cu130torch2.14sm80.86.89.90.100-py3-none-any.whl", None)
    assert long is not None and len(long[0]) <= 16


def test_the_labelled_wheel_carries_variant_json_in_its_record(tmp_path: Path) -> None:
    wheel = variant_wheel(tmp_path, "fa-demo", "1.0", "2.14", archs="100")
    doc = variants_doc({"cu130sm100": {"nvidia": {"sm_arch": ["100_real"]}}})
    out = zipfile.ZipFile(__import__("io").BytesIO(label_wheel(wheel.read_bytes(), doc)))
    dist_info = "fa_demo-1.0+cu130torch2.14sm100.dist-info"
    assert json.loads(out.read(f"{dist_info}/variant.json")) == doc
    record = out.read(f"{dist_info}/RECORD").decode()
    assert f"{dist_info}/variant.json,sha256=" in record and record.endswith(
        f"{dist_info}/RECORD,,\n"
    )
    assert out.testzip() is None


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("wv")
    store = LocalStore(tmp / "store")
    publish(
        store,
        [
            variant_wheel(tmp / "w", "fa-demo", "1.0", "2.14", cuda=cuda, archs=archs)
            for cuda, archs in (("13.0", "90"), ("13.0", "100"), ("12.8", "100"))
        ]
        + [make_wheel(tmp / "w", "torch", "2.14.1")],
    )
    assert write_wheel_variants(store, store.wheels()) > 0
    assert write_wheel_variants(store, store.wheels()) == 0  # nothing new: nothing written
    with running_server(store.root) as server:
        yield server, tmp


@pytest.mark.parametrize(
    ("sm", "driver", "expected"),
    [
        ("9.0", "13.0", "1.0+cu130torch2.14sm90"),
        ("10.0", "13.0", "1.0+cu130torch2.14sm100"),
        ("10.0", "12.8", "1.0+cu128torch2.14sm100"),  # the driver runs CUDA 12.8 only
        ("12.0", "13.0", None),  # an RTX PRO 6000: no build has sm_120 kernels
    ],
)
def test_uv_picks_the_build_for_the_gpu_from_one_url(
    index: tuple[RunningServer, Path], sm: str, driver: str, expected: str | None
) -> None:
    server, tmp = index
    # uv looks in --extra-index-url first and takes a name from the first index that has it:
    # fa-demo from the wheel-variants tree only, torch (not there) from the other one, which
    # stands in for PyPI here (it also has the plain fa-demo wheels, which uv never sees).
    env = installer_env(tmp) | {
        "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": sm,
        "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": driver,
    }
    venv = tmp / f"venv-{sm}-{driver}"
    subprocess.run(
        [uv_bin(), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env
    )
    done = subprocess.run(
        [
            uv_bin(),
            "pip",
            "install",
            "--preview-features",
            "wheel-variants",
            "--python",
            str(venv / "bin/python"),
            "--index-url",
            server.url + "simple/",
            "--extra-index-url",
            server.url + "wheel-variants/simple/",
            "fa-demo",
            "torch==2.14.1",
            "-v",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if expected is None:
        assert done.returncode != 0 and "unsupported wheel variants" in done.stderr, done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert f"fa-demo=={expected}" in done.stderr.replace(" + ", "")
    assert "-variants.json" in done.stderr  # it read the index-level metadata
    label = expected.split("+")[1].replace("torch2.14", "")
    assert f"-{label}.whl" in done.stderr  # and installed the labelled copy
