"""Longest-first compile order: build.ninja rewriting, the setup.py hook, and a real ninja."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factory.matrix.cell import Cell
from factory.matrix.load import load_matrix
from factory.planning.critical_path import (
    BEGIN,
    END,
    prepare_build_tree,
    reorder_build_ninja,
    strip_hook,
)
from factory.planning.memory_model import BuildMeasurement, MemoryHistory

REPO = Path(__file__).resolve().parents[2]
EXT = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
FA = "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311"

TORCH_STYLE = """ninja_required_version = 1.3
cxx = c++
nvcc = /usr/local/cuda/bin/nvcc

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
  depfile = $out.d
  deps = gcc

rule cuda_compile
  depfile = $out.d
  deps = gcc
  command = $nvcc --generate-dependencies-with-compile -c $in -o $out $cuda_post_cflags

build /t/build/temp.linux-x86_64-cpython-311/csrc/a_short.o: cuda_compile /t/csrc/a_short.cu
build /t/build/temp.linux-x86_64-cpython-311/csrc/bindings.o: compile /t/csrc/bindings.cpp
build /t/build/temp.linux-x86_64-cpython-311/csrc/m_new.o: cuda_compile /t/csrc/m_new.cu
build /t/build/temp.linux-x86_64-cpython-311/csrc/z_long.o: cuda_compile /t/csrc/z_long.cu

"""

PRIORITIES = {"csrc/a_short": 10.0, "csrc/bindings": 30.0, "csrc/z_long": 400.0}


def build_lines(text: str) -> list[str]:
    return [line.split(": ", 1)[0][len("build "):].rsplit("/", 1)[1]
            for line in text.splitlines() if line.startswith("build ")]


def test_reorder_puts_longest_first_and_unknown_at_the_mean() -> None:
    out = reorder_build_ninja(TORCH_STYLE, PRIORITIES)
    # mean of known = 146.7: the new file goes between the long one and the short ones.
    assert build_lines(out) == ["z_long.o", "m_new.o", "bindings.o", "a_short.o"]
    assert sorted(out.splitlines()) == sorted(TORCH_STYLE.splitlines())
    assert out.split("build ")[0] == TORCH_STYLE.split("build ")[0]  # rules untouched


def test_reorder_is_idempotent_and_noop_without_times() -> None:
    once = reorder_build_ninja(TORCH_STYLE, PRIORITIES)
    assert reorder_build_ninja(once, PRIORITIES) == once
    assert reorder_build_ninja(TORCH_STYLE, {}) == TORCH_STYLE


def test_reorder_moves_indented_variables_with_their_statement() -> None:
    text = ("rule cuda_compile\n  command = x\n"
            "build a.o: cuda_compile src/a.cu\n  flags = -DA\n"
            "build b.o: cuda_compile src/b.cu\n  flags = -DB\n")
    out = reorder_build_ninja(text, {"src/a": 1.0, "src/b": 2.0})
    assert out.index("build b.o") < out.index("flags = -DB") < out.index("build a.o") \
        < out.index("flags = -DA")


def test_reorder_leaves_continued_statements_alone() -> None:
    text = ("rule compile\n  command = x\nbuild a.o: compile src/a.cpp $\n    extra.h\n"
            "build b.o: compile src/b.cpp\n")
    assert reorder_build_ninja(text, {"src/a": 1.0, "src/b": 2.0}) == text


def test_reorder_handles_escaped_spaces_in_paths() -> None:
    text = ("build /t/x$ y/a.o: cuda_compile /t/x$ y/src/a.cu\n"
            "build /t/x$ y/b.o: cuda_compile /t/x$ y/src/b.cu\n")
    assert build_lines(reorder_build_ninja(text, {"src/a": 1.0, "src/b": 9.0}))[0] == "b.o"


@pytest.fixture
def history(tmp_path: Path) -> MemoryHistory:
    h = MemoryHistory.load(tmp_path / "history.json")
    h.record(BuildMeasurement(cell=Cell.from_id(EXT), nvcc_threads=1, max_jobs=2,
                              peak_job_bytes=None, object_seconds=PRIORITIES, source="unit"))
    return h


SETUP_PY = '''"""A docstring that must stay first."""
from __future__ import annotations

import os
print("setup body ran")
'''


def test_prepare_build_tree_inserts_after_docstring_and_future(tmp_path: Path,
                                                               history: MemoryHistory) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text(SETUP_PY)
    pc = load_matrix(REPO / "matrix.toml").find(EXT)
    order = prepare_build_tree(tree, pc, history)
    assert order.applied and order.first[0] == "csrc/z_long"
    text = (tree / "setup.py").read_text()
    assert text.startswith('"""A docstring')
    assert text.index("from __future__") < text.index(BEGIN) < text.index("import os")
    compile(text, "setup.py", "exec")
    # A resumed build rewrites the block instead of stacking a second one.
    prepare_build_tree(tree, pc, history)
    again = (tree / "setup.py").read_text()
    assert again.count(BEGIN) == 1 and again.count(END) == 1
    assert strip_hook(again) == SETUP_PY


def test_prepare_build_tree_without_times_changes_nothing(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text(SETUP_PY)
    pc = load_matrix(REPO / "matrix.toml").find(EXT)
    empty = MemoryHistory({"version": 1, "defaults": {}, "memory": [], "objects": []}, path=None)
    order = prepare_build_tree(tree, pc, empty)
    assert not order.applied and "no per-object compile times" in order.reason
    assert (tree / "setup.py").read_text() == SETUP_PY


def test_prepare_build_tree_uses_the_shipped_flash_attn_log(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("import os\n")
    pc = load_matrix(REPO / "matrix.toml").find(FA)
    history = MemoryHistory.load(tmp_path / "h.json")
    order = prepare_build_tree(tree, pc, history)
    assert order.applied
    # the cell's own shipped times (the flagship build): its longest object first, and the
    # split-KV forward kernels (the longest in every real run) ahead of the rest
    times = history.object_times(pc.cell)
    assert times is not None and times.archs == pc.cell.archs
    assert order.first[0] == max(times.seconds, key=lambda k: times.seconds[k])
    assert all("flash_fwd_split" in k for k in order.first[:3])


FAKE_TORCH = '''
import shutil

def _run_ninja_build(build_directory, verbose, error_prefix):
    shutil.copy(build_directory + "/build.ninja", build_directory + "/seen.ninja")
'''


def test_hook_reorders_build_ninja_when_torch_runs_ninja(tmp_path: Path,
                                                         history: MemoryHistory) -> None:
    fake = tmp_path / "fake"
    (fake / "torch" / "utils").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    (fake / "torch" / "utils" / "__init__.py").write_text("")
    (fake / "torch" / "utils" / "cpp_extension.py").write_text(FAKE_TORCH)
    tree = tmp_path / "tree"
    build = tree / "build"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text(TORCH_STYLE)
    (tree / "setup.py").write_text(
        "import sys\nfrom torch.utils import cpp_extension\n"
        "cpp_extension._run_ninja_build(sys.argv[1], False, 'x')\n"
    )
    prepare_build_tree(tree, load_matrix(REPO / "matrix.toml").find(EXT), history)
    env = {**os.environ, "PYTHONPATH": str(fake)}
    res = subprocess.run([sys.executable, "setup.py", str(build)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    assert "reordered longest-first" in res.stderr
    assert build_lines((build / "seen.ninja").read_text())[0] == "z_long.o"


@pytest.mark.skipif(shutil.which("ninja") is None, reason="no ninja on PATH")
def test_real_ninja_starts_edges_in_the_rewritten_order(tmp_path: Path) -> None:
    # -j1 makes the start order the log order: no timing involved.
    names = ["a", "b", "c", "d", "e"]
    seconds = {"src/a": 1.0, "src/b": 5.0, "src/c": 2.0, "src/d": 4.0, "src/e": 3.0}
    (tmp_path / "src").mkdir()
    for n in names:
        (tmp_path / "src" / f"{n}.cu").write_text(n)
    text = "rule cuda_compile\n  command = cp $in $out\n" + "".join(
        f"build obj/{n}.o: cuda_compile src/{n}.cu\n" for n in names)
    (tmp_path / "build.ninja").write_text(reorder_build_ninja(text, seconds))
    subprocess.run(["ninja", "-j1"], cwd=tmp_path, check=True, capture_output=True)
    log = [line.split("\t")[3] for line in (tmp_path / ".ninja_log").read_text().splitlines()
           if not line.startswith("#")]
    assert log == ["obj/b.o", "obj/d.o", "obj/e.o", "obj/c.o", "obj/a.o"]


FAKE_NINJA = """#!/bin/sh
# Stands in for ninja: reports a version, keeps the build.ninja it was given, compiles nothing.
if [ "$1" = "--version" ]; then echo 1.13.2; exit 0; fi
cp build.ninja "$FACTORY_SEEN_NINJA"
exit 1
"""


def test_hook_with_real_torch_and_setuptools(tmp_path: Path) -> None:
    """The whole path on the real stack: setuptools sorts the sources, torch writes
    build.ninja, the hook reorders it before ninja runs. Skipped where torch is absent."""
    pytest.importorskip("torch")
    tree = tmp_path / "ext"
    shutil.copytree(REPO / "tests" / "example_ext", tree,
                    ignore=shutil.ignore_patterns("build", "*.egg-info"))
    history = MemoryHistory.load(tmp_path / "h.json")
    times = {"csrc/square": 90.0, "csrc/add": 10.0, "csrc/bindings": 50.0, "csrc/relu": 30.0,
             "csrc/scale": 60.0}
    history.record(BuildMeasurement(cell=Cell.from_id(EXT), nvcc_threads=1, max_jobs=1,
                                    peak_job_bytes=None, object_seconds=times, source="unit"))
    assert prepare_build_tree(tree, load_matrix(REPO / "matrix.toml").find(EXT), history).applied
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ninja").write_text(FAKE_NINJA)
    (bin_dir / "ninja").chmod(0o755)
    seen = tmp_path / "seen.ninja"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "FACTORY_SEEN_NINJA": str(seen), "TORCH_CUDA_ARCH_LIST": "10.0", "MAX_JOBS": "1",
           "TORCH_NO_COMPILER_WRAPPER": "1"}
    subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=tree, env=env,
                   capture_output=True, text=True)
    assert seen.exists(), "torch never ran ninja"
    assert [name.rsplit(".", 1)[0] for name in build_lines(seen.read_text())] == [
        "square", "scale", "bindings", "relu", "add"]
