"""The factory's compiler wrappers (factory/runners/inside/compilers.py, toolkit.py): nvcc compiles
exactly the cell's archs whatever a package hard-codes, and the C++ standard follows torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tools import cuda_toolkit

from factory.matrix.cell import Cell
from factory.recipes import get_recipe
from factory.runners.base import BuildJob, CompilerReport, RunResult, result_from_report
from factory.runners.inside import toolkit
from factory.runners.inside.build import compiler_summary
from factory.runners.inside.compilers import Refused, narrow, raise_std
from factory.runners.inside.log import Log
from factory.wheels.binaries import find_cuobjdump

# causal-conv1d 1.7.0's setup.py with CUDA 13: nine -gencode pairs, no variable to change them
CAUSAL_CONV1D = [t for a in (75, 80, 87, 90, 100, 120, 103, 110, 121)
                 for t in ("-gencode", f"arch=compute_{a},code=sm_{a}")]


def test_a_hard_coded_list_is_narrowed_to_the_cells_arch_in_place() -> None:
    argv = ["-c", "k.cu", "-o", "k.o", "-O3", *CAUSAL_CONV1D, "--threads", "4"]
    new, record = narrow(argv, [100])
    assert new == ["-c", "k.cu", "-o", "k.o", "-O3", "-gencode=arch=compute_100,code=sm_100",
                   "--threads", "4"]
    assert record["asked"] == [75, 80, 87, 90, 100, 103, 110, 120, 121]
    assert record["compiled"] == [100] and 100 not in record["dropped"]


def test_a_call_that_already_compiles_the_cells_archs_is_left_as_it_is() -> None:
    for argv in (["-c", "k.cu", "-gencode=arch=compute_100,code=sm_100"],
                 ["-c", "k.cu", "-arch=sm_90"],  # nvcc's shorthand: SASS and PTX of 90
                 ["--version"], ["-E", "k.cu"]):
        assert narrow(argv, [90, 100] if "-arch=sm_90" not in argv else [90]) == (argv, {})


@pytest.mark.parametrize(
    ("argv", "archs", "kept"),
    [
        # every spelling of a target
        (["-c", "k.cu", "--generate-code=arch=compute_90,code=sm_90",
          "--generate-code", "arch=compute_100,code=sm_100"], [100],
         ["-gencode=arch=compute_100,code=sm_100"]),
        # a code list: the cell's SASS and PTX stay, the rest go
        (["-c", "k.cu", "-gencode=arch=compute_90a,code=[sm_90a,compute_90a]",
          '-gencode=arch=compute_120,code="sm_120,compute_120"'], [90],
         ["-gencode=arch=compute_90a,code=[sm_90a,compute_90a]"]),
        # -arch/-code
        (["-c", "k.cu", "-arch=compute_80", "-code=sm_80,sm_90,sm_100"], [90, 100],
         ["-gencode=arch=compute_80,code=[sm_90,sm_100]"]),
        # 'all' and 'native' depend on nvcc and the machine: the cell's archs instead
        (["-c", "k.cu", "-arch=all"], [100], ["-gencode=arch=compute_100,code=sm_100"]),
    ],
)
def test_target_spellings(argv: list[str], archs: list[int], kept: list[str]) -> None:
    new, record = narrow(argv, archs)
    assert [a for a in new if "arch" in a or a.startswith("-code")] == kept
    assert new[:2] == ["-c", "k.cu"]


def test_a_compile_that_names_no_arch_gets_the_cells() -> None:
    new, record = narrow(["-c", "k.cu", "-o", "k.o"], [90, 100])
    assert new[-2:] == ["-gencode=arch=compute_90,code=sm_90",
                        "-gencode=arch=compute_100,code=sm_100"]
    assert record == {"asked": [], "compiled": [90, 100], "injected": True}


@pytest.mark.parametrize("argv", [
    ["-c", "csrc/k.cu", "-gencode", "arch=compute_80,code=sm_80"],
    ["-c", "csrc/k.cu", "-gencode=arch=compute_100,code=compute_100"],  # PTX only: no SASS
])
def test_a_compile_with_none_of_the_cells_archs_is_refused_in_one_line(argv: list[str]) -> None:
    with pytest.raises(Refused) as info:
        narrow(argv, [100])
    message = str(info.value)
    assert "\n" not in message and "csrc/k.cu" in message and "sm_100" in message


OUT_OF_CELL = ["-gencode", "arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]


@pytest.mark.parametrize("phase", [
    ["-E"], ["--preprocess"], ["-M"], ["-MM"], ["--generate-dependencies"],
    ["--generate-nonsystem-dependencies"], ["-Xcompiler", "-M"], ["-Xcompiler=-fPIC,-MM"],
    ["--compiler-options", "-MM"],
])
def test_a_call_that_makes_no_device_code_is_never_refused(phase: list[str]) -> None:
    """Preprocessing or a dependency list compiles nothing: out-of-cell targets pass as they
    are, and a call with the cell's arch among them is narrowed like the compile it serves."""
    argv = [*phase, "csrc/k.cu", *OUT_OF_CELL]
    assert narrow(argv, [100]) == (argv, {})
    new, record = narrow([*argv, "-gencode=arch=compute_100,code=sm_100"], [100])
    assert [a for a in new if "arch=" in a] == ["-gencode=arch=compute_100,code=sm_100"]
    assert record["dropped"] == [80, 90]


@pytest.mark.parametrize("argv", [
    ["-c", "csrc/k.cu", "-MD", "-MF", "k.d", *OUT_OF_CELL],  # a dependency list beside a compile
    ["-c", "csrc/k.cu", "-Xcompiler", "-MMD", *OUT_OF_CELL],
    ["-c", "csrc/k.cu", "-Mfoo", *OUT_OF_CELL],  # not -M
])
def test_a_compile_that_also_lists_dependencies_is_still_refused(argv: list[str]) -> None:
    with pytest.raises(Refused, match=r"none of the cell's archs \(sm_100\) for csrc/k.cu"):
        narrow(argv, [100])


@pytest.mark.parametrize(
    ("argv", "nvcc", "want", "changed"),
    [
        (["-c", "k.cu", "-std=c++17"], True, ["-c", "k.cu", "-std=c++20"], True),
        (["-c", "k.cu", "-std", "c++14"], True, ["-c", "k.cu", "-std", "c++20"], True),
        (["-c", "k.cu"], True, ["-c", "k.cu", "-std=c++20"], True),  # nvcc's default is 17
        (["-c", "k.cu", "-Xcompiler", "-std=gnu++17"], True,
         ["-c", "k.cu", "-Xcompiler", "-std=gnu++20", "-std=c++20"], True),
        (["-c", "k.cu", "-std=c++20"], True, ["-c", "k.cu", "-std=c++20"], False),
        (["-c", "x.cpp", "-std=gnu++17", "-O3"], False, ["-c", "x.cpp", "-std=gnu++20", "-O3"],
         True),
        (["-c", "x.c", "-std=c11"], False, ["-c", "x.c", "-std=c11"], False),  # C stays C
        (["-c", "x.cpp"], False, ["-c", "x.cpp"], False),  # torch adds its own -std there
    ],
)
def test_the_cxx_standard_is_raised_never_lowered(
    argv: list[str], nvcc: bool, want: list[str], changed: bool
) -> None:
    new, what = raise_std(argv, 20, nvcc=nvcc)
    assert new == want and bool(what) is changed
    assert raise_std(argv, None, nvcc=nvcc) == (argv, "")  # torch < 2.13: as the package pins


# -- the wrapper in front of the real nvcc --------------------------------------------------
# One tiny kernel that compiles only as C++20 (nvcc's own default is C++17).
KERNEL = ("#if __cplusplus < 202002L\n#error not C++20\n#endif\n"
          "__global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }\n")
# A package that hard-codes four -gencode targets and -std=c++17, as causal-conv1d and mamba-ssm
# do, and calls nvcc the way torch's builder does: $CUDA_HOME/bin/nvcc. Plain setuptools.
SETUP_PY = """\
import os
import subprocess

from setuptools import Command, setup

GENCODE = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
           "-gencode", "arch=compute_100,code=sm_100", "-gencode", "arch=compute_120,code=sm_120"]


class BuildKernels(Command):
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        nvcc = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        subprocess.run([nvcc, "-c", "k.cu", "-o", "k.o", "-std=c++17", *GENCODE], check=True)


setup(name="four-archs", version="0.1.0", py_modules=[], cmdclass={"build_kernels": BuildKernels})
"""


def _cuobjdump() -> str:
    return str(find_cuobjdump())  # the factory's own (a dependency: nvidia-cuda-cuobjdump)


def _wrapped(tmp_path: Path, archs: tuple[int, ...]) -> tuple[Path, dict[str, str]]:
    """The build's toolkit as the build script makes it for a torch 2.14.1 cell of ``archs``
    (the job's compilers section is the generic recipe's), and the variables it sets."""
    real = cuda_toolkit()
    cell = Cell(package="four-archs", version="0.1.0", torch="2.14.1", cuda="13.0",
                archs=archs, python="3.11")
    spec = {**get_recipe("torch-extension").compilers(cell), "dir": str(tmp_path / "toolkit"),
            "log": str(tmp_path / "compilers.jsonl")}
    home, cxx = toolkit.install(spec, real=real, python=sys.executable,
                                log=Log(str(tmp_path / "build.log")))
    extra: dict[str, str] = {}
    toolkit.environment(spec, home=home, cxx_wrapper=cxx, real=real, nvcc_next=[],
                        extra=extra, log_path=spec["log"])
    env = {**os.environ, **extra, "PATH": f"{home / 'bin'}:{os.environ['PATH']}"}
    return home, env


def _setup_py(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The package's build of its kernel, through the build's CUDA_HOME."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "setup.py").write_text(SETUP_PY)
    (pkg / "k.cu").write_text(KERNEL)
    return subprocess.run([sys.executable, "setup.py", "-q", "build_kernels"], cwd=pkg, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_setup_py_with_four_hard_coded_targets_compiles_the_cells_one(tmp_path: Path) -> None:
    """Real nvcc: the object holds SASS for the cell's one arch only, and the package's pinned
    -std=c++17 came out as C++20 (the kernel stops with #error below it) for torch 2.14.1."""
    home, env = _wrapped(tmp_path, (100,))
    proc = _setup_py(tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    elf = subprocess.run([_cuobjdump(), "--list-elf", str(tmp_path / "pkg/k.o")],
                         capture_output=True, text=True, timeout=60).stdout
    cubins = {ln.rsplit(".", 2)[-2] for ln in elf.splitlines() if ".cubin" in ln}
    assert cubins == {"sm_100"}, elf
    (rec,) = [json.loads(ln) for ln in (tmp_path / "compilers.jsonl").read_text().splitlines()]
    assert rec["source"] == "k.cu" and rec["asked"] == [80, 90, 100, 120]
    assert rec["compiled"] == [100] and rec["dropped"] == [80, 90, 120]
    assert rec["std"] == "-std=c++17 -> -std=c++20"
    summary = compiler_summary(str(tmp_path / "compilers.jsonl"))
    assert summary["narrowed"] == 1 and summary["std_raised"] == 1
    assert summary["compiled_archs"] == [100] and summary["refused"] is None
    # everything else of the toolkit is the real one, through links
    assert (home / "include").resolve() == (cuda_toolkit() / "include").resolve()
    assert subprocess.run(["nvcc", "--version"], env=env, capture_output=True,
                          timeout=60).returncode == 0


def test_a_setup_py_with_none_of_the_cells_archs_is_refused(tmp_path: Path) -> None:
    _, env = _wrapped(tmp_path, (110,))
    proc = _setup_py(tmp_path, env)
    assert proc.returncode != 0 and not (tmp_path / "pkg/k.o").exists()
    assert ("factory: nvcc would compile none of the cell's archs (sm_110) for k.cu: the package "
            "asks for sm_80, sm_90, sm_100, sm_120\n") in proc.stderr
    assert compiler_summary(str(tmp_path / "compilers.jsonl"))["refused"].startswith(
        "nvcc would compile none of the cell's archs (sm_110)")


def test_the_host_wrapper_raises_a_pinned_standard(tmp_path: Path) -> None:
    home, env = _wrapped(tmp_path, (100,))
    (tmp_path / "x.cpp").write_text(
        "#include <compare>\nauto c = (1 <=> 2);\n"  # C++20 only
        "#if __cplusplus < 202002L\n#error not C++20\n#endif\n")
    proc = subprocess.run([env["CXX"], "-std=c++17", "-c", "x.cpp", "-o", "x.o"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert env["FACTORY_CXX_NEXT"] in ("c++", os.environ.get("CXX", "c++"))


def test_no_toolkit_means_no_wrappers_not_a_crash(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose toolkit has no nvcc (a CPU-only build in an image without CUDA) builds with
    its compilers as they are, and says so."""
    from factory.runners.inside.build import Build

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    (tmp_path / "kit").mkdir()
    build = Build({"log": str(tmp_path / "build.log"), "report": str(tmp_path / "r.json"),
                   "cuda_home": str(tmp_path / "kit"), "env": {"CXX": "g++"},
                   "compilers": {"archs": [100], "cxx_std": 20, "dir": str(tmp_path / "tk"),
                                 "log": str(tmp_path / "c.jsonl")}})
    extra = build.environment(sys.executable, [], {})
    assert extra is not None and extra["CXX"] == "g++" and "FACTORY_CELL_ARCHS" not in extra
    assert not (tmp_path / "tk").exists()
    assert "the compiler wrappers are off" in (tmp_path / "build.log").read_text()


def test_the_report_of_the_wrappers_is_what_the_factory_reads(tmp_path: Path) -> None:
    """The inside script's compiler summary (stdlib only) and the factory's type for it
    (runners/base.CompilerReport, what the pipeline and the provenance read) name the same keys."""
    log = tmp_path / "compilers.jsonl"
    log.write_text(json.dumps({"asked": [80, 100], "compiled": [100], "dropped": ["sm_80"]}))
    summary = compiler_summary(str(log))
    assert set(summary) == CompilerReport.__required_keys__
    job = BuildJob(cell_id="c", src_dir=tmp_path, out_dir=tmp_path, wheelhouse=tmp_path,
                   cuda_home=None, requirements=(), log_path=tmp_path / "b.log")

    def result(report: dict[str, object]) -> RunResult:
        return result_from_report(job=job, report=report, exit_code=0, oom_killed=False,
                                  oom_kill_count=None, cgroup_peak_bytes=None, wall_seconds=1.0,
                                  timed_out=False, runner="local")

    read = result({"compilers": summary}).compilers
    assert read == summary and read is not None and read["narrowed"] == 1
    assert result({}).compilers is None  # a build without the wrappers
