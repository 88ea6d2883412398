"""matrix.toml -> cells: expansion, include/exclude, and one-line errors before any build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FLASH_ATTN_MATRIX

from factory.cli import main
from factory.errors import CellError, ConfigError
from factory.matrix.cell import Cell
from factory.matrix.load import load_matrix, wheel_filename

REPO = Path(__file__).resolve().parents[2]

BASE = FLASH_ATTN_MATRIX


def _ids(text: str) -> list[str]:
    return [pc.cell.id for pc in load_matrix(text=text).cells]


def _error(text: str) -> str:
    """The first problem found (every problem is one line)."""
    with pytest.raises(ConfigError) as exc:
        load_matrix(text=text)
    assert all("\n" not in line for line in exc.value.lines)
    return exc.value.lines[0]


# -- expansion ------------------------------------------------------------------------------------
def test_the_product_of_the_axes() -> None:
    text = BASE.replace('torch = ["2.14.1"]', 'torch = ["2.14.1", "2.13.0"]')
    text = text.replace('python = ["3.11"]', 'python = ["3.11", "3.12"]')
    text = text.replace('archs = [["10.0"]]', 'archs = [["10.0"], ["9.0", "10.0"]]')
    m = load_matrix(text=text)
    assert len(m.cells) == 8
    assert len({pc.cell for pc in m.cells}) == 8
    assert len({pc.wheel for pc in m.cells}) == 8, "every cell has its own wheel filename"
    assert [pc.cell.id for pc in m.cells] == sorted(pc.cell.id for pc in m.cells)
    assert "flash-attn-2.8.3.post2-torch2.13.0-cu130-sm90+sm100-cp312" in [
        pc.cell.id for pc in m.cells
    ]


def test_a_planned_cell_knows_its_wheel_and_toolchain() -> None:
    pc = load_matrix(text=BASE + '[settings]\nplat = "manylinux_2_28_x86_64"\n').cells[0]
    assert (
        pc.wheel
        == "flash_attn-2.8.3.post2+cu130torch2.14sm100-cp311-cp311-manylinux_2_28_x86_64.whl"
    )
    assert pc.wheel == wheel_filename(pc.cell, pc.local, "manylinux_2_28_x86_64")
    assert pc.toolchain.cuda == "13.0" and pc.toolchain.torch_requirement == "torch==2.14.1"
    assert pc.as_dict()["id"] == pc.cell.id


def test_a_package_axis_overrides_the_global_one() -> None:
    text = BASE + 'python = ["3.12"]\n'  # appended to [packages.flash-attn]
    assert _ids(text) == ["flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp312"]


def test_cell_ids_round_trip_and_content_keys_follow_the_recipe_revision() -> None:
    for pc in load_matrix(text=BASE).cells:
        assert Cell.from_id(pc.cell.id) == pc.cell
        assert pc.content_key == pc.cell.content_key(pc.recipe.revision, manylinux=pc.manylinux)
        assert pc.cell.content_key("2") != pc.content_key


def test_include_adds_a_cell_and_exclude_removes_cells() -> None:
    text = (
        BASE.replace('python = ["3.11"]', 'python = ["3.11", "3.12"]')
        + """
[[exclude]]
python = "3.12"
reason = "not yet"

[[include]]
package = "flash-attn"
torch = "2.14.1"
cuda = "13.0"
archs = ["9.0"]
python = "3.12"
"""
    )
    assert _ids(text) == [
        "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311",
        "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm90-cp312",
    ]


def test_exclude_by_torch_minor_and_by_arch_set() -> None:
    text = BASE.replace('torch = ["2.14.1"]', 'torch = ["2.14.1", "2.13.0"]')
    text = text.replace('archs = [["10.0"]]', 'archs = [["10.0"], ["9.0", "10.0"]]')
    text += '[[exclude]]\ntorch = "2.13"\n[[exclude]]\narchs = ["10.0", "9.0"]\n'
    assert _ids(text) == ["flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311"]


def test_excluding_everything_is_an_error() -> None:
    assert "no cells" in _error(BASE + '[[exclude]]\npackage = "flash-attn"\n')


def test_find_a_cell_in_and_outside_the_matrix() -> None:
    m = load_matrix(text=BASE)
    pc = m.cells[0]
    assert m.find(pc.cell.id) == pc
    # a cell the matrix does not list: refused, naming the nearest; a one-off may ask for it
    with pytest.raises(CellError, match=f"not a cell of the matrix; the nearest matrix cell is "
                       f"{pc.cell.id}$"):
        m.find("flash-attn-2.8.3.post2-torch2.14.1-cu130-sm120-cp311")
    other = m.find("flash-attn-2.8.3.post2-torch2.14.1-cu130-sm120-cp311", outside=True)
    assert other.cell.archs == (120,)
    with pytest.raises(CellError, match="not in the matrix"):
        m.find("xformers-0.1-torch2.14.1-cu130-sm100-cp311", outside=True)
    with pytest.raises(CellError, match="unparseable cell id"):
        m.find("flash-attn")


@pytest.mark.parametrize(("typo", "why"), [
    ("flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp31", "Python 3.1 is not one"),
    ("flash-attn-2.8.3.post2-torch2.14.1-cu13-sm100-cp311", "CUDA 1.3 does not exist"),
    ("flash-attn-2.8.3.post2-torch2.14.1-cu130-sm95-cp311", "sm_95 is no GPU's"),
])
def test_an_implausible_cell_id_is_refused_with_the_nearest(typo: str, why: str) -> None:
    m = load_matrix(text=BASE)
    with pytest.raises(CellError) as found:
        m.find(typo, outside=True)
    assert why in found.value.message
    assert found.value.message.endswith(f"the nearest matrix cell is {m.cells[0].cell.id}")
    with pytest.raises(CellError, match=why):
        Cell.from_id(typo)


FA = "flash-attn-2.8.3.post2-torch2.14.1"


@pytest.mark.parametrize(("typed", "nearest"), [
    # one axis mistyped: the cell with only that axis changed, to its closest value
    (f"{FA}-cu130-sm100-cp31", f"{FA}-cu130-sm100-cp310"),  # not cp314 (string likeness)
    (f"{FA}-cu130-sm100-cp39", f"{FA}-cu130-sm100-cp310"),
    (f"{FA}-cu13-sm100-cp311", f"{FA}-cu130-sm100-cp311"),  # CUDA 13.x, not cu132
    (f"{FA}-cu130-sm101-cp311", f"{FA}-cu130-sm100-cp311"),  # not sm120
    (f"{FA}-cu130-sm99-cp311", f"{FA}-cu130-sm100-cp311"),
    (f"{FA}-cu130-sm89-cp311", f"{FA}-cu130-sm90-cp311"),
    (f"{FA}-cu128-sm100-cp312", f"{FA}-cu130-sm100-cp312"),  # keeps torch, changes the CUDA
    ("flash-attn-2.8.3.post2-torch2.9.0-cu130-sm100-cp311", f"{FA}-cu130-sm100-cp311"),
    ("flash-atn-2.8.3.post2-torch2.14.1-cu130-sm90-cp312-arm64", f"{FA}-cu130-sm90-cp312-aarch64"),
    # a cell the matrix knows will not build: the nearest that builds keeps the GPU
    (f"{FA}-cu126-sm100-cp311", f"{FA}-cu130-sm100-cp311"),
])
def test_the_nearest_cell_differs_in_the_fewest_axes(typed: str, nearest: str) -> None:
    m = load_matrix(REPO / "matrix.toml")  # its lock: 100+ cells, offline
    assert len(m.cells) > 100
    assert nearest in {pc.cell.id for pc in m.cells}
    assert m.nearest(typed) == nearest
    with pytest.raises(CellError) as found:
        m.find(typed)
    assert found.value.message.endswith(f"; the nearest matrix cell is {nearest}")


def test_an_id_that_does_not_parse_gets_the_likest_string() -> None:
    m = load_matrix(REPO / "matrix.toml")
    assert m.nearest("causal-conv1d") == "causal-conv1d-1.7.0-torch2.14.1-cu130-sm100-cp311"


def test_a_cell_known_not_to_build_is_a_cell_error_with_its_reason(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "factory", "plan", f"{FA}-cu126-sm100-cp311"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == CellError.exit_code != ConfigError.exit_code
    error, tip = r.stderr.strip().splitlines()
    assert error == (f"ERROR sm_100 needs CUDA >= 12.8, but the cell asks for CUDA 12.6 "
                     f"({FA}-cu126-sm100-cp311); the nearest matrix cell is {FA}-cu130-sm100-cp311")
    assert tip.startswith("TIP the matrix knows this cell will not build")


# -- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            BASE.replace("[axes]", "[axis]"),
            "unknown key 'axis' in the matrix (did you mean 'axes'?)",
        ),
        (
            BASE + '[settings]\nstor = "x"\n',
            "unknown key 'stor' in [settings] (did you mean 'store'?)",
        ),
        (BASE.replace("archs =", "arch ="), "unknown key 'arch' in [axes] (did you mean 'archs'?)"),
        (
            BASE.replace("versions =", "verions ="),
            "unknown key 'verions' in [packages.flash-attn] (did you mean 'versions'?)",
        ),
        (
            BASE + '[[exclude]]\npyton = "3.11"\n',
            "unknown key 'pyton' in [[exclude]] #1 (did you mean 'python'?)",
        ),
        (
            BASE.replace('recipe = "flash-attn"', 'recipe = "flash_attn"'),
            "unknown recipe 'flash_attn' (did you mean 'flash-attn'?)",
        ),
    ],
)
def test_unknown_keys_get_a_did_you_mean(text: str, expected: str) -> None:
    assert _error(text).startswith(expected)


def test_sm100_with_cuda_12_4_is_one_line() -> None:
    msg = _error(BASE.replace('cuda = ["13.0"]', 'cuda = ["12.4"]'))
    assert msg.startswith("sm_100 needs CUDA >= 12.8, but the cell asks for CUDA 12.4")


def test_sm120_with_cuda_12_6_is_refused_too() -> None:
    text = BASE.replace('cuda = ["13.0"]', 'cuda = ["12.6"]').replace('["10.0"]', '["12.0"]')
    text = text.replace('torch = ["2.14.1"]', 'torch = ["2.10.0"]')
    assert _error(text).startswith("sm_120 needs CUDA >= 12.8")


def test_a_cuda_major_no_build_of_that_torch_uses() -> None:
    text = BASE.replace('cuda = ["13.0"]', 'cuda = ["11.8"]').replace('["10.0"]', '["8.0"]')
    assert _error(text).startswith(
        "no build of torch 2.14.1 uses CUDA 11.x (its builds: 12.6 (declared), 13.0 (PyPI's), "
        "13.2 (declared))")


def test_a_cuda_minor_that_torch_has_no_build_for() -> None:
    text = BASE.replace('cuda = ["13.0"]', 'cuda = ["12.9"]')
    assert _error(text).startswith("torch 2.14.1 has no CUDA 12.9 build")


def test_an_unknown_torch_minor() -> None:
    assert _error(BASE.replace('"2.14.1"', '"2.99.0"')).startswith(
        "torch 2.99.0 is not a torch release in the shipped snapshot of")
    assert _error(BASE.replace('"2.14.1"', '"2.14.7"')).startswith(
        "torch 2.14.7 is not a release (torch 2.14: 2.14.0, 2.14.1;")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('torch = ["2.14.1"]', 'torch = ["2.x"]', "axes.torch: unparseable torch version '2.x'"),
        (
            'cuda = ["13.0"]',
            'cuda = ["thirteen"]',
            "axes.cuda: unparseable CUDA version 'thirteen'",
        ),
        ('python = ["3.11"]', 'python = ["3.x"]', "axes.python: unparseable Python version '3.x'"),
        ('archs = [["10.0"]]', 'archs = [["sm_abc"]]', "axes.archs: unparseable GPU arch 'sm_abc'"),
        (
            'versions = ["2.8.3.post2"]',
            'versions = ["banana"]',
            "[packages.flash-attn] versions: unparseable flash-attn version 'banana'",
        ),
        (
            'torch = ["2.14.1"]',
            'torch = ["2.14.1+cu130"]',
            "axes.torch: torch version '2.14.1+cu130' must not carry a local part",
        ),
        ('torch = ["2.14.1"]', "torch = [2.10]", "axes.torch: 2.1 is a TOML number"),
        (
            'archs = [["10.0"]]',
            'archs = [["10.0"], "9.0"]',
            "axes.archs mixes arch sets and single archs",
        ),
    ],
)
def test_unparseable_values(old: str, new: str, expected: str) -> None:
    assert _error(BASE.replace(old, new)).startswith(expected)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            '[[exclude]]\npython = "3.x"\n',
            "[[exclude]] #1.python: unparseable Python version '3.x'",
        ),
        ('[[exclude]]\npackage = "xformers"\n', "[[exclude]] #1 names unknown package 'xformers'"),
        (
            '[[include]]\npackage = "flash-attn"\ntorch = "2.14.1"\n',
            "[[include]] #1 needs cuda, archs, python",
        ),
        (
            '[[include]]\ntorch = "2.14.1"\ncuda = "13.0"\narchs = ["9.0"]\npython = "3.11"\n',
            "[[include]] #1 needs package",
        ),
        (
            '[[include]]\npackage = "flash-attn"\ntorch = ["2.14.1", "2.13.0"]\ncuda = "13.0"\n'
            'archs = ["9.0"]\npython = "3.11"\n',
            "[[include]] #1 torch must be one value",
        ),
        (
            '[[include]]\npackage = "flash-attn"\ntorch = "2.14.1"\ncuda = "12.4"\n'
            'archs = ["10.0"]\npython = "3.11"\n',
            "sm_100 needs CUDA >= 12.8",
        ),
    ],
)
def test_bad_rules(rule: str, expected: str) -> None:
    assert _error(BASE + rule).startswith(expected)


def test_a_recipe_refuses_an_arch_it_cannot_build() -> None:
    assert _error(BASE.replace('["10.0"]', '["8.6"]')).startswith(
        "flash-attn cannot build arch(s) sm_86"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("this is = not toml [", "matrix is not valid TOML"),
        ("version = 2\n" + BASE, "matrix version 2 is not supported"),
        ("[axes]\ntorch = []\n", "axes.torch is an empty list"),
        ('[axes]\ntorch = ["2.14.1"]\n', "the matrix declares no [packages.NAME] table"),
        (
            BASE + 'source = "no/such/dir"\n',
            "[packages.flash-attn] source directory 'no/such/dir' does not exist",
        ),
        (BASE + 'sha256 = "abc"\n', "[packages.flash-attn] sha256 must be 64 hex digits"),
    ],
)
def test_other_invalid_matrices(text: str, expected: str) -> None:
    assert _error(text).startswith(expected)


def test_a_missing_matrix_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_matrix(tmp_path / "matrix.toml")


# -- the command ----------------------------------------------------------------------------------
def test_factory_matrix_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "matrix.toml"
    bad.write_text(BASE.replace('cuda = ["13.0"]', 'cuda = ["12.4"]'))
    result = subprocess.run(
        [sys.executable, "-m", "factory", "matrix", "--matrix", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == ConfigError.exit_code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR sm_100 needs CUDA >= 12.8")
    assert result.stdout == ""


def test_factory_matrix_json_on_the_shipped_matrix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    assert main(["matrix", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1
    assert out["cells"], "the shipped matrix has cells"
    for cell in out["cells"]:
        assert Cell.from_id(cell["id"]).id == cell["id"]
        assert cell["wheel"].endswith(".whl")
    assert any(c["package"] == "flash-attn" and c["archs"] == [100] for c in out["cells"])
    # and for GB200 (Grace, aarch64) hosts: the same sm_100 kernels, a linux_aarch64 wheel
    assert any(c["package"] == "flash-attn" and c["archs"] == [100] and c["platform"] == "aarch64"
               and c["wheel"].endswith("_aarch64.whl") for c in out["cells"])


# -- settings -------------------------------------------------------------------------------------
def test_settings_are_resolved_once(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(
        '[settings]\nstore = "st"\nwork-dir = "/abs/work"\nmemory = "16g"\ncpus = 4\n'
        '[settings.compile-cache]\nsize = "5g"\n' + BASE
    )
    s = load_matrix(path).settings
    assert s.store == str(tmp_path / "st")  # relative to the matrix file's directory
    assert s.wheelhouse == tmp_path / ".cache/factory/wheelhouse"
    assert s.work_dir == Path("/abs/work")
    assert (s.memory, s.cpus) == (16 * 1024**3, 4)
    assert (s.compile_cache.dir, s.compile_cache.size) == (Path("/abs/compile-cache"), "5G")
    defaults = load_matrix(text=BASE).settings
    assert (defaults.memory, defaults.cpus) == (None, None)
    assert defaults.store == str(Path.cwd() / "index/store")  # no file: from the current directory
    s3 = load_matrix(text='[settings]\nstore = "s3://bucket/pre"\n' + BASE).settings
    assert s3.store == "s3://bucket/pre"


@pytest.mark.parametrize("spec", ["ftp://host/x", "s3://", "s3:///prefix"])
def test_an_unparseable_store_is_one_line(spec: str) -> None:
    assert _error(f'[settings]\nstore = "{spec}"\n' + BASE) == (
        f"[settings] store {spec!r} is not a directory or s3://bucket/prefix"
    )


def test_a_broken_matrix_is_no_reason_to_use_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.toml").write_text("[settings]\nstore = 5\n" + BASE)
    assert main(["index", "rebuild"]) == ConfigError.exit_code
    assert "[settings] store must be a non-empty string" in capsys.readouterr().err
    assert not (tmp_path / "index").exists()
