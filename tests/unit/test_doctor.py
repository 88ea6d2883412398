"""`factory doctor` on recorded hosts (tests/data/doctor/*.txt: nvidia-smi outputs) with a fake
torch on PYTHONPATH, against real index pages made by publishing fake builds into a store, read
as a directory and over HTTP. Always through the real CLI in a subprocess."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import doctor_fixtures
import pytest
from doctor_fixtures import FA, HOSTS, doctor, doctor_matrix, doctor_store, pip_line
from ops_builds import factory_cli, planned, publish_build, write_matrix

from factory.hosts.probe import driver_max_cuda, driver_runs_cuda, parse_nvidia_smi

torch_dirs = doctor_fixtures.torch_dirs
sm90_and_sm100 = doctor_fixtures.sm90_and_sm100
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


@pytest.fixture(scope="module")
def sm100_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return doctor_store(tmp_path_factory.mktemp("idx"), "sm100", '[["10.0"]]')


def test_recorded_outputs_parse() -> None:
    driver, gpus, note = parse_nvidia_smi((HOSTS / "h200.txt").read_text())
    assert [(g.name, g.sm) for g in gpus] == [("NVIDIA H200", 90)] and driver and note is None
    driver, gpus, _ = parse_nvidia_smi((HOSTS / "b200.txt").read_text())
    assert len(gpus) == 8 and {g.sm for g in gpus} == {100}
    assert [g.sm for g in parse_nvidia_smi((HOSTS / "rtx-pro-6000.txt").read_text())[1]] == [120]
    driver, gpus, note = parse_nvidia_smi((HOSTS / "no-gpu.txt").read_text())
    assert driver is None and gpus == () and note and "NVIDIA-SMI has failed" in note


def test_driver_table() -> None:
    assert driver_max_cuda("580.65.06") == "13.0"
    assert driver_max_cuda("570.133.20") == "12.8"
    assert driver_runs_cuda("580.95.05", "13.0")
    assert not driver_runs_cuda("570.133.20", "13.0")
    assert driver_runs_cuda("570.133.20", "12.9")  # minor-version compatibility within 12.x


def test_b200_gets_the_variant_install_line(sm100_only: Path, torch_dirs: dict[str, Path]) -> None:
    r = doctor(sm100_only, "b200.txt", torch_dirs["2.14-cu130"])
    assert r.returncode == 0, r.stdout + r.stderr
    url = sm100_only.resolve().as_uri()
    assert pip_line(f"{url}/cu130-torch2.14-sm100/simple/", f"{FA}sm100") in r.stdout
    assert "sm_100 (compute capability 10.0)" in r.stdout
    assert "variant     cu130-torch2.14" in r.stdout


def test_rtx_pro_6000_against_sm100_builds_says_why(sm100_only: Path, torch_dirs: dict[str, Path]) -> None:
    r = doctor(sm100_only, "rtx-pro-6000.txt", torch_dirs["2.14-cu130"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"the GPU is sm_120 ({RTX}) but the index only has sm_100 builds of flash-attn "
            "for cu130-torch2.14") in r.stdout
    assert "pip install" not in r.stdout
    # Every format says so, and exits 1: no snippet that would install something else.
    for fmt in ("pip", "uv", "poetry", "pdm"):
        r = doctor(sm100_only, "rtx-pro-6000.txt", torch_dirs["2.14-cu130"], "--format", fmt)
        assert r.returncode == 1, (fmt, r.stdout + r.stderr)
        assert r.stdout.startswith("# no wheel fits: flash-attn: the GPU is sm_120"), r.stdout
        assert "url" not in r.stdout and "install" not in r.stdout
    r = doctor(sm100_only, "rtx-pro-6000.txt", torch_dirs["2.14-cu130"], "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["results"][0]["install"] is None


def test_h200_picks_sm90_and_b200_is_pinned_past_pips_choice(
    sm90_and_sm100: Path, torch_dirs: dict[str, Path]
) -> None:
    r = doctor(sm90_and_sm100, "h200.txt", torch_dirs["2.14-cu130"], "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == 1 and doc["host"]["gpus"][0]["sm"] == 90
    (result,) = doc["results"]
    assert "sm90" in result["wheel"]
    # Each arch set has its own URL, so the H200 gets the sm90 one, and the exact build.
    assert result["install"].endswith(f"/cu130-torch2.14-sm90/simple/ {FA}sm90")

    r = doctor(sm90_and_sm100, "b200.txt", torch_dirs["2.14-cu130"])
    assert r.returncode == 0, r.stdout + r.stderr
    # ...and a B200 the sm100 one: no URL offers a build its GPU cannot run.
    assert f"/cu130-torch2.14-sm100/simple/ {FA}sm100\n" in r.stdout


def test_no_gpu_picks_by_torch_with_a_warning(sm100_only: Path, torch_dirs: dict[str, Path]) -> None:
    r = doctor(sm100_only, "no-gpu.txt", torch_dirs["2.14-cu130"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu         none found (NVIDIA-SMI has failed" in r.stdout
    assert "WARNING flash-attn: no NVIDIA GPU found" in r.stdout
    assert "holds kernels for sm_100 only" in r.stdout
    assert f"/cu130-torch2.14-sm100/simple/ {FA}sm100\n" in r.stdout
    # The warnings stay in every format (as comments), and in the JSON.
    for fmt in ("pip", "uv", "poetry", "pdm"):
        r = doctor(sm100_only, "no-gpu.txt", torch_dirs["2.14-cu130"], "--format", fmt)
        assert r.returncode == 0, (fmt, r.stdout + r.stderr)
        assert "# WARNING flash-attn: no NVIDIA GPU found" in r.stdout
        assert "holds kernels for sm_100 only" in r.stdout
    r = doctor(sm100_only, "no-gpu.txt", torch_dirs["2.14-cu130"], "--json")
    (result,) = json.loads(r.stdout)["results"]
    assert any("no NVIDIA GPU found" in w for w in result["warnings"])


def test_other_torch_minor_and_cuda_say_why(sm100_only: Path, torch_dirs: dict[str, Path]) -> None:
    r = doctor(sm100_only, "b200.txt", torch_dirs["2.11-cu130"])
    assert r.returncode == 1
    assert "torch is 2.11.0 but the index only has flash-attn for torch 2.14" in r.stdout
    r = doctor(sm100_only, "b200.txt", torch_dirs["2.14-cu128"])
    assert r.returncode == 1
    assert ("torch 2.14.1 is built with CUDA 12.8 but the index only has cu130 builds of flash-attn "
            "for torch 2.14") in r.stdout


def test_old_driver_says_why(sm100_only: Path, torch_dirs: dict[str, Path]) -> None:
    r = doctor(sm100_only, "h200-driver570.txt", torch_dirs["2.14-cu130"])
    assert r.returncode == 1
    assert "the NVIDIA driver 570.133.20 supports CUDA up to 12.8" in r.stdout
    assert "(driver >= 580.65.06 needed)" in r.stdout


def test_broken_or_missing_torch_does_not_crash_the_doctor(
    sm100_only: Path, torch_dirs: dict[str, Path], tmp_path: Path
) -> None:
    r = doctor(sm100_only, "b200.txt", torch_dirs["broken"])
    assert r.returncode == 1, r.stderr
    assert "torch       not importable: OSError: libcudart.so.13" in r.stdout
    assert "install torch there first" in r.stdout and "Traceback" not in r.stdout + r.stderr
    # The interpreter itself dying while importing torch (a segfault, say) is reported too.
    crash = tmp_path / "crash" / "torch"
    crash.mkdir(parents=True)
    (crash / "__init__.py").write_text("import os\nos._exit(139)\n")
    r = doctor(sm100_only, "b200.txt", crash.parent)
    assert r.returncode == 1, r.stderr
    assert "exited with 139 while importing torch" in r.stdout


def test_glibc_older_than_the_wheels_says_why(tmp_path: Path, torch_dirs: dict[str, Path]) -> None:
    store = doctor_store(tmp_path, "future", '[["10.0"]]', plat="manylinux_2_99_x86_64")
    r = doctor(store, "b200.txt", torch_dirs["2.14-cu130"])
    assert r.returncode == 1
    assert "needs glibc >= 2.99" in r.stdout


def test_without_index_reads_the_host_only(torch_dirs: dict[str, Path]) -> None:
    r = factory_cli("doctor", "--nvidia-smi-output", str(HOSTS / "h200.txt"), "--json",
                    env={"PYTHONPATH": str(torch_dirs["2.14-cu130"])})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["results"] == [] and doc["host"]["variant"] == "cu130-torch2.14"
    assert doc["host"]["torch"] == "2.14.1" and doc["host"]["torch_cuda"] == "13.0"
    assert doc["host"]["glibc"] and doc["host"]["max_cuda"] == "13.0"


def test_runs_the_hosts_nvidia_smi_with_the_query(tmp_path: Path, torch_dirs: dict[str, Path],
                                                   sm100_only: Path) -> None:
    """No recorded file: the doctor runs `nvidia-smi` from PATH (here a stand-in that prints the
    recorded B200 output only when asked the expected query)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--query-gpu=name,compute_cap,driver_version" ] && [ "$2" = "--format=csv,noheader" ]; then\n'
        f'  cat "{HOSTS / "b200.txt"}"\nelse\n  echo "unexpected arguments: $*" >&2; exit 2\nfi\n'
    )
    smi.chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)  # the host's python3: this one
    env = {"PYTHONPATH": str(torch_dirs["2.14-cu130"]), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    r = factory_cli("doctor", "--index", str(sm100_only), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "read from   nvidia-smi" in r.stdout and "NVIDIA B200, sm_100" in r.stdout
    # Without nvidia-smi (and without a working NVML) the host has no GPU, and says so.
    env["PATH"] = str(tmp_path / "empty")
    r = factory_cli("doctor", "--index", str(sm100_only), "--python", sys.executable, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu         none found (nvidia-smi not found" in r.stdout
    assert "WARNING flash-attn: no NVIDIA GPU found" in r.stdout


def test_a_variant_needing_a_newer_glibc_than_the_host_is_named(
    tmp_path: Path, torch_dirs: dict[str, Path]
) -> None:
    store = tmp_path / "store"
    for torch, plat in (("2.14.1", "manylinux_2_28_x86_64"), ("2.11.0", "manylinux_2_99_x86_64")):
        root = tmp_path / torch
        root.mkdir()
        for pc in planned(write_matrix(root, doctor_matrix('[["10.0"]]', torch=f'"{torch}"'))):
            publish_build(store, root / "dist", pc, plat=plat)
    r = doctor(store, "b200.txt", torch_dirs["2.14-cu130"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"glibc\s+\d+\.\d+ \(x86_64\)", r.stdout)  # the host's own, named
    assert ("1 flash-attn wheel(s) on the index need a newer one and cannot install here: "
            "cu130-torch2.11-sm100 (glibc >= 2.99)") in r.stdout


def test_the_url_names_the_hosts_platform(tmp_path: Path) -> None:
    """x86_64 and aarch64 builds of one cell: one variant URL, each host its own CPU's wheel."""
    import dataclasses

    from index_wheels import variant_wheel

    from factory.hosts.doctor import diagnose
    from factory.hosts.probe import Gpu, HostInfo
    from factory.index.publish import publish
    from factory.store import LocalStore

    store = LocalStore(tmp_path / "store")
    tags = [f"cp311-cp311-manylinux_2_28_{m}" for m in ("x86_64", "aarch64")]
    publish(store, [variant_wheel(tmp_path, "fa-demo", "1.0", "2.14", archs="100", tag=t) for t in tags])
    host = HostInfo(python="3.11", python_exe="python3", python_source="--python",
                    torch="2.14.1", torch_local="cu130",
                    torch_cuda="13.0", torch_error=None, driver="580.95.05",
                    gpus=(Gpu(name="NVIDIA GB200", sm=100),), gpu_source="recorded", gpu_note=None,
                    glibc=(2, 39), machine="aarch64")
    (choice,) = diagnose(host, str(store.root), ["fa-demo"]).choices
    assert choice.index_url and choice.index_url.endswith("/cu130-torch2.14-sm100/simple/")
    assert choice.wheel and choice.wheel.endswith("_aarch64.whl")
    x86 = dataclasses.replace(host, machine="x86_64")
    (x86_choice,) = diagnose(x86, str(store.root), ["fa-demo"]).choices
    assert x86_choice.index_url == choice.index_url
    assert x86_choice.wheel and x86_choice.wheel.endswith("_x86_64.whl")


@pytest.fixture(scope="module")
def both_platforms(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sm_100 builds for x86_64 (B200) and aarch64 (GB200) hosts, each with its planned tag."""
    root = tmp_path_factory.mktemp("idx") / "platforms"
    root.mkdir()
    text = doctor_matrix('[["10.0"]]').replace(
        "[packages.", 'platform = ["x86_64", "aarch64"]\n[packages.'
    )
    cells = planned(write_matrix(root, text))
    assert sorted(pc.cell.platform for pc in cells) == ["aarch64", "x86_64"]
    for pc in cells:
        plat = pc.wheel.removesuffix(".whl").split("-")[-1]
        publish_build(root / "store", root / "dist", pc, plat=plat)
    return root / "store"


def test_grace_host_gets_the_aarch64_wheel_from_the_same_url(
    both_platforms: Path, torch_dirs: dict[str, Path]
) -> None:
    url = both_platforms.resolve().as_uri()
    line = pip_line(f"{url}/cu130-torch2.14-sm100/simple/", f"{FA}sm100")
    grace = doctor(both_platforms, "gb200.txt", torch_dirs["2.14-cu130"], "--machine", "arm64")
    assert grace.returncode == 0, grace.stdout + grace.stderr
    assert "a Grace host (GB200)" in grace.stdout
    assert re.search(r"flash-attn: flash_attn-\S+-manylinux_2_\d+_aarch64\.whl", grace.stdout)
    b200 = doctor(both_platforms, "b200.txt", torch_dirs["2.14-cu130"], "--machine", "x86_64")
    assert b200.returncode == 0, b200.stdout + b200.stderr
    assert "Grace" not in b200.stdout
    assert re.search(r"flash-attn: flash_attn-\S+-manylinux_2_\d+_x86_64\.whl", b200.stdout)
    assert line in grace.stdout and line in b200.stdout  # one URL serves both CPUs
    report = json.loads(doctor(both_platforms, "gb200.txt", torch_dirs["2.14-cu130"],
                               "--machine", "aarch64", "--json").stdout)
    assert report["host"]["grace"] == "GB200" and report["host"]["machine"] == "aarch64"


def test_grace_host_against_x86_64_builds_says_why(
    sm100_only: Path, torch_dirs: dict[str, Path]
) -> None:
    r = doctor(sm100_only, "gb200.txt", torch_dirs["2.14-cu130"], "--machine", "aarch64")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "this host is aarch64 but the index only has flash-attn for x86_64" in r.stdout


def test_reads_the_python3_on_path_and_names_python_when_torch_is_missing(
    sm100_only: Path, tmp_path: Path
) -> None:
    """Without --python the doctor reads the interpreter a host's `pip install` goes into, the
    python3 on PATH, not its own; with no torch there it says how to point it elsewhere."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    r = factory_cli("doctor", "--index", str(sm100_only), "--nvidia-smi-output",
                    str(HOSTS / "b200.txt"), env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"({bin_dir / 'python3'}: the python3 on PATH)" in r.stdout
    assert (f"torch is not importable with {bin_dir / 'python3'}, the python3 on PATH "
            "(ModuleNotFoundError") in r.stdout
    assert "pass --python with the interpreter of the environment that has torch" in r.stdout
