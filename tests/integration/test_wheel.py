"""Raw wheel -> final wheel: analysis, tag, torch pin, RECORD, auditwheel repair, exact filename."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import ExampleBuild
from wheel_fixtures import compile_kernel_so, ext_wheel, planned

from factory.errors import WheelError
from factory.process import find_program
from factory.wheels.finalize import finalize_wheel
from factory.wheels.reader import analyse_wheel


@pytest.fixture(scope="module")
def sm90_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_kernel_so(tmp_path_factory.mktemp("so") / "k90.so", "arch=compute_90,code=sm_90")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _needs(so: Path, dest: Path, *libs: str) -> Path:
    """A copy of ``so`` that also lists ``libs`` as DT_NEEDED (as a torch extension would)."""
    dest.write_bytes(so.read_bytes())
    patchelf = find_program("patchelf")
    for lib in libs:
        subprocess.run([str(patchelf), "--add-needed", lib, str(dest)], check=True)
    return dest


# -- analyse_wheel --------------------------------------------------------------------------------
def test_analyse_reads_names_tags_metadata_and_files(tmp_path: Path, sm90_so: Path) -> None:
    raw = ext_wheel(
        tmp_path, sm90_so, requires=["torch", "numpy>=1"], metadata_extra="Requires-Python: >=3.9\n"
    )
    info = analyse_wheel(raw)
    assert (info.name, info.version, info.filename_name) == ("demo-ext", "0.1.0", "demo-ext")
    assert info.tags == ("cp311-cp311-linux_x86_64",) == info.wheel_tags
    assert info.requires_dist == ("torch", "numpy>=1")
    assert info.requires_python == ">=3.9"
    assert info.top_level == ("demo_ext",)
    assert info.extensions == ("demo_ext/_kernels.so",)
    assert info.record_ok and info.local is None
    assert [str(r) for r in info.torch_requirements()] == ["torch"]


# -- finalize_wheel -------------------------------------------------------------------------------
def test_finalize_tags_pins_rerecords_and_repairs(tmp_path: Path, sm90_so: Path) -> None:
    raw = ext_wheel(tmp_path / "raw", sm90_so, requires=["torch", "numpy>=1"])
    before = _sha(raw)
    pc = planned()
    out = finalize_wheel(raw, pc, tmp_path / "out")
    assert out == tmp_path / "out" / pc.wheel
    assert out.name == "demo_ext-0.1.0+cu130torch2.14sm90-cp311-cp311-manylinux_2_36_x86_64.whl"
    info = analyse_wheel(out)
    assert info.version == "0.1.0+cu130torch2.14sm90"
    assert info.dist_info == "demo_ext-0.1.0+cu130torch2.14sm90.dist-info"
    assert info.requires_dist == ("numpy>=1", "torch==2.14.*")
    assert info.wheel_tags == ("cp311-cp311-manylinux_2_36_x86_64",)
    assert info.record_ok
    assert _sha(raw) == before, "the raw wheel must stay as the build left it"
    assert [p.name for p in (tmp_path / "out").iterdir()] == [pc.wheel], "no temp files left behind"


def test_finalize_is_idempotent(tmp_path: Path, sm90_so: Path) -> None:
    pc = planned()
    once = finalize_wheel(
        ext_wheel(tmp_path / "raw", sm90_so, requires=["torch"]), pc, tmp_path / "1"
    )
    twice = finalize_wheel(once, pc, tmp_path / "2")
    assert twice.name == once.name == pc.wheel
    assert (
        analyse_wheel(twice).requires_dist
        == analyse_wheel(once).requires_dist
        == ("torch==2.14.*",)
    )


def test_finalize_adds_a_pin_when_torch_is_not_required(tmp_path: Path, sm90_so: Path) -> None:
    raw = ext_wheel(tmp_path / "raw", sm90_so)
    info = analyse_wheel(finalize_wheel(raw, planned(), tmp_path / "out"))
    assert info.requires_dist == ("torch==2.14.*",)


def test_finalize_keeps_a_local_version_the_build_set_when_it_is_the_planned_one(
    tmp_path: Path, sm90_so: Path
) -> None:
    pc = planned("flash-attn", version="2.8.3.post2", archs=(90,), recipe="flash-attn")
    raw = ext_wheel(
        tmp_path / "raw", sm90_so, name="flash_attn", version="2.8.3.post2+cu130torch2.14sm90"
    )
    out = finalize_wheel(raw, pc, tmp_path / "out")
    assert out.name == pc.wheel
    assert analyse_wheel(out).version == "2.8.3.post2+cu130torch2.14sm90"


def test_finalize_refuses_a_different_local_version(tmp_path: Path, sm90_so: Path) -> None:
    pc = planned("flash-attn", version="2.8.3.post2", archs=(90,), recipe="flash-attn")
    raw = ext_wheel(
        tmp_path / "raw",
        sm90_so,
        name="flash_attn",
        version="2.8.3.post2+cu12torch2.14cxx11abiTRUE",
    )
    with pytest.raises(
        WheelError,
        match=r"local version \+cu12torch2.14cxx11abitrue differs .*\+cu130torch2.14sm90",
    ):
        finalize_wheel(raw, pc, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"name": "other_ext"}, "the cell builds 'demo-ext'"),
        ({"version": "0.2.0"}, "built version 0.2.0, the cell wants 0.1.0"),
        ({"requires": ["torch<2.0"]}, "requires 'torch<2.0'"),
        ({"break_record": True}, "broken RECORD"),
    ],
)
def test_finalize_refuses_a_wheel_that_contradicts_the_plan(
    tmp_path: Path, sm90_so: Path, kw: dict[str, object], match: str
) -> None:
    raw = ext_wheel(tmp_path / "raw", sm90_so, **kw)
    with pytest.raises(WheelError, match=match):
        finalize_wheel(raw, planned(), tmp_path / "out")


def test_finalize_keeps_torch_requirements_behind_an_extra(tmp_path: Path, sm90_so: Path) -> None:
    raw = ext_wheel(tmp_path / "raw", sm90_so, requires=["torch>=2; extra == 'dev'"])
    info = analyse_wheel(finalize_wheel(raw, planned(), tmp_path / "out"))
    assert set(info.requires_dist) == {"torch>=2; extra == 'dev'", "torch==2.14.*"}


def test_finalize_does_not_vendor_torch_or_cuda_libraries(tmp_path: Path, sm90_so: Path) -> None:
    # Linked like a real extension, yet none of these exist on this host: without the
    # excludes auditwheel would fail to find them (or, with torch installed, copy gigabytes).
    so = _needs(
        sm90_so,
        tmp_path / "linked.so",
        "libc10.so",
        "libtorch_cpu.so",
        "libtorch_python.so",
        "libc10_cuda.so",
        "libcudart.so.13",
        "libcuda.so.1",
        "libcublas.so.13",
    )
    raw = ext_wheel(tmp_path / "raw", so)
    out = finalize_wheel(raw, planned(), tmp_path / "out")
    with zipfile.ZipFile(out) as zf:
        vendored = [n for n in zf.namelist() if ".libs/" in n]
    assert vendored == []


def test_finalize_reports_a_failed_repair_in_one_line(tmp_path: Path, sm90_so: Path) -> None:
    so = _needs(sm90_so, tmp_path / "linked.so", "libfactory-test-missing.so.7")
    raw = ext_wheel(tmp_path / "raw", so)
    with pytest.raises(WheelError) as exc:
        finalize_wheel(raw, planned(), tmp_path / "out")
    assert exc.value.message.startswith("auditwheel repair failed")
    assert "\n" not in exc.value.message
    assert not any((tmp_path / "out").iterdir()), "the temp dir is removed after a failure"


def test_finalize_refuses_a_filename_other_than_planned(tmp_path: Path, sm90_so: Path) -> None:
    raw = ext_wheel(tmp_path / "raw", sm90_so, tag="cp312-cp312-linux_x86_64")
    with pytest.raises(WheelError, match="the plan says demo_ext-0.1.0"):
        finalize_wheel(raw, planned(), tmp_path / "out")


@pytest.mark.slow
@pytest.mark.docker
def test_finalize_the_real_example_extension(tmp_path: Path, example_build: ExampleBuild) -> None:
    raw = example_build.raw  # the session's default build, before finalize
    pc = planned("factory-example-ext", archs=(100,))
    out = finalize_wheel(raw, pc, tmp_path)
    assert (
        out.name
        == "factory_example_ext-0.1.0+cu130torch2.14sm100-cp311-cp311-manylinux_2_36_x86_64.whl"
    )
    info = analyse_wheel(out)
    assert info.record_ok
    assert "torch==2.14.*" in info.requires_dist
    assert info.top_level == ("factory_example_ext",)
    assert not [n for n in zipfile.ZipFile(out).namelist() if ".libs/" in n], "nothing vendored"
    # Only the tags and RECORD change; a vendored libtorch would have made it gigabytes.
    assert out.stat().st_size < 2 * raw.stat().st_size
