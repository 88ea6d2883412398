"""Recipes as data: the shipped TOML files, a matrix's own [recipes.NAME], their knobs, fixes,
the C++ standard torch needs, and every problem in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from factory.errors import BuildError, ConfigError
from factory.matrix.cell import Cell
from factory.matrix.load import load_matrix
from factory.recipes import RECIPES, SHIPPED_DIR, Recipe, cxx_standard, get_recipe

REPO = Path(__file__).resolve().parents[2]
FLASH = get_recipe("flash-attn")
GENERIC = get_recipe("torch-extension")


def _cell(
    archs: tuple[int, ...] = (100,), torch: str = "2.14.1", version: str = "2.8.3.post2",
    package: str = "flash-attn",
) -> Cell:
    return Cell(
        package=package, version=version, torch=torch, cuda="13.0", archs=archs, python="3.11"
    )


def test_every_shipped_recipe_is_a_toml_file_and_nothing_else() -> None:
    assert set(RECIPES) == {p.stem for p in SHIPPED_DIR.glob("*.toml")}
    assert {"flash-attn", "torch-extension", "causal-conv1d", "mamba-ssm", "torch-scatter",
            "grouped-gemm"} <= set(RECIPES)
    assert sorted(p.name for p in SHIPPED_DIR.glob("*.py")) == ["__init__.py", "base.py"]
    for name, recipe in RECIPES.items():
        assert recipe.name == name and recipe.revision and recipe.origin == "shipped"


def test_flash_attn_env_for_sm100() -> None:
    env = FLASH.env(_cell(), max_jobs=3, nvcc_threads=2, local_version="cu130torch2.14sm100")
    assert env == {
        "FLASH_ATTN_CUDA_ARCHS": "100",
        "MAX_JOBS": "3",
        "NVCC_THREADS": "2",
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTENTION_SKIP_CUDA_BUILD": "FALSE",
        "FLASH_ATTN_LOCAL_VERSION": "cu130torch2.14sm100",
        "TORCH_CUDA_ARCH_LIST": "10.0",
    }


def test_flash_attn_arch_list_is_semicolon_separated_and_sorted() -> None:
    env = FLASH.env(_cell((100, 90)), max_jobs=1, nvcc_threads=1, local_version="x")
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "90;100"
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0;10.0"


def test_flash_attn_passes_nvcc_threads_the_generic_recipe_does_not() -> None:
    assert FLASH.supports_threads()
    assert not GENERIC.supports_threads()
    assert not get_recipe("causal-conv1d").supports_threads()


def test_causal_conv1d_and_mamba_force_the_build_and_take_the_local_version() -> None:
    conv = get_recipe("causal-conv1d").env(
        _cell(package="causal-conv1d", version="1.7.0"), max_jobs=2, nvcc_threads=1,
        local_version="cu130torch2.14sm100")
    assert conv == {"TORCH_CUDA_ARCH_LIST": "10.0", "MAX_JOBS": "2",
                    "CAUSAL_CONV1D_FORCE_BUILD": "TRUE", "CAUSAL_CONV1D_SKIP_CUDA_BUILD": "FALSE",
                    "CAUSAL_CONV1D_LOCAL_VERSION": "cu130torch2.14sm100"}
    mamba = get_recipe("mamba-ssm")
    assert mamba.env(_cell(package="mamba-ssm", version="2.3.2.post1"), max_jobs=1,
                     nvcc_threads=1, local_version="x")["MAMBA_FORCE_BUILD"] == "TRUE"
    assert mamba.smoke.imports == ("selective_scan_cuda",) and not mamba.smoke.with_dependencies
    assert get_recipe("torch-scatter").env_vars == {"FORCE_CUDA": "1"}
    assert get_recipe("grouped-gemm").check_build_requires is False


def test_a_hard_coded_arch_list_is_the_supported_set() -> None:
    conv = get_recipe("causal-conv1d")
    with pytest.raises(ConfigError, match=r"cannot build arch\(s\) sm_86; it supports sm_75"):
        conv.check_cell(_cell((86,), package="causal-conv1d", version="1.7.0"))
    conv.check_cell(_cell((90, 100, 121), package="causal-conv1d", version="1.7.0"))


@pytest.mark.parametrize(("torch", "std"), [("2.14.1", 20), ("2.13.0", 20), ("2.15.0", 20),
                                            ("2.12.1", None), ("2.11.0", None)])
def test_the_cxx_standard_follows_torch(torch: str, std: int | None) -> None:
    assert cxx_standard(torch) == std
    for recipe in (FLASH, GENERIC, get_recipe("mamba-ssm")):
        assert recipe.compilers(_cell(torch=torch))["cxx_std"] == std


def test_no_shipped_recipe_fixes_the_cxx_standard_by_text() -> None:
    """One mechanism for every package (the compiler wrappers), not a text fix per recipe."""
    for recipe in RECIPES.values():
        assert not any("-std" in f.replace or "c++" in f.with_ for f in recipe.fixes), recipe.name


def test_the_dry_run_lines_name_the_narrowing_the_standard_and_the_fixes() -> None:
    conv = get_recipe("causal-conv1d")
    lines = conv.describe(_cell(package="causal-conv1d", version="1.7.0"))
    assert lines[0].startswith("nvcc compiles sm_100 only")
    assert lines[1] == ("causal-conv1d's own arch list with CUDA 13.0 (sm_75, sm_80, sm_87, "
                        "sm_90, sm_100, sm_103, sm_110, sm_120, sm_121) is narrowed to sm_100")
    assert any(ln.startswith("C++20 for host and device code") for ln in lines)
    old = conv.describe(_cell(package="causal-conv1d", version="1.7.0", torch="2.11.0"))
    assert not any("C++" in ln for ln in old)


# causal-conv1d 1.7.0's and mamba-ssm 2.3.2.post1's setup.py: sm_75, 80, 87, 90, + 100, 120 from
# CUDA 12.8, + 103, 110, 121 from CUDA 13.0
@pytest.mark.parametrize(("cuda", "own"), [
    ("12.6", (75, 80, 87, 90)),
    ("12.8", (75, 80, 87, 90, 100, 120)),
    ("12.9", (75, 80, 87, 90, 100, 120)),
    ("13.0", (75, 80, 87, 90, 100, 103, 110, 120, 121)),
    ("13.2", (75, 80, 87, 90, 100, 103, 110, 120, 121)),
])
@pytest.mark.parametrize("name", ["causal-conv1d", "mamba-ssm"])
def test_a_hard_coded_list_is_named_for_the_cells_cuda(name: str, cuda: str, own: tuple[int, ...]
                                                        ) -> None:
    recipe = get_recipe(name)
    assert recipe.package_archs(cuda) == own
    cell = Cell(package=name, version="1", torch="2.10.0", cuda=cuda, archs=(90,), python="3.11")
    assert recipe.compilers(cell)["package_archs"] == list(own)
    names = ", ".join(f"sm_{a}" for a in own)
    assert recipe.describe(cell)[1] == (f"{name}'s own arch list with CUDA {cuda} ({names}) is "
                                        "narrowed to sm_90")
    # the tag's unmarked set is that list with CUDA 13.0
    assert recipe.package_archs("13.0") == recipe.default_archs


def test_the_own_list_line_without_a_hard_coded_list() -> None:
    # a cell with all of a package's own archs narrows nothing
    conv = get_recipe("causal-conv1d")
    same = Cell(package="causal-conv1d", version="1.7.0", torch="2.10.0", cuda="12.8",
                archs=(75, 80, 87, 90, 100, 120), python="3.11")
    assert conv.describe(same)[1].endswith("is the cell's (sm_75, sm_80, sm_87, sm_90, sm_100, "
                                           "sm_120): nothing is dropped")
    # a package with its own arch variable builds what the factory sets there
    assert FLASH.describe(_cell((90, 100)))[1] == (
        "flash-attn builds the archs of FLASH_ATTN_CUDA_ARCHS, set to the cell's: "
        "FLASH_ATTN_CUDA_ARCHS=90;100")
    # no data (the generic recipe, a private one): neutral
    for recipe in (GENERIC, _recipe('revision = "1"')):
        assert recipe.package_archs("13.0") is None
        assert recipe.describe(_cell())[1] == (
            "the package's own list is unknown; nvcc will compile only sm_100")
        assert recipe.compilers(_cell())["package_archs"] == []


def _recipe(table: str, name: str = "my-ext") -> Recipe:
    from factory.tomlread import tomllib

    return Recipe.from_table(name, tomllib.loads(textwrap.dedent(table)), where=f"[recipes.{name}]",
                             origin="test")


def test_a_fix_applies_by_its_when_and_edits_the_source_once(tmp_path: Path) -> None:
    recipe = _recipe("""
        revision = "2"
        [[fixes]]
        reason = "an old header"
        file = "csrc/k.cu"
        replace = "#include <old.h>"
        with = "#include <new.h>"
        when = { torch = ">=2.14", version = "<1.1" }
    """)
    assert [f.reason for f in recipe.fixes_for(_cell(version="1.0"))] == ["an old header"]
    assert recipe.fixes_for(_cell(version="1.1")) == []
    assert recipe.fixes_for(_cell(version="1.0", torch="2.13.0")) == []
    (fix,) = recipe.fixes
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc/k.cu").write_text("#include <old.h>\nint x;\n")
    assert fix.apply(tmp_path) is True
    assert (tmp_path / "csrc/k.cu").read_text() == "#include <new.h>\nint x;\n"
    assert fix.apply(tmp_path) is False, "a resumed build tree is already fixed"
    (tmp_path / "csrc/k.cu").write_text("nothing to replace here\n")
    with pytest.raises(BuildError, match="the recipe needs updating"):
        fix.apply(tmp_path)


def test_arch_variable_spellings() -> None:
    recipe = _recipe("""
        revision = "1"
        [knobs]
        archs = "MY_ARCHS"
        arch-format = "sm_{sm}"
        arch-separator = ","
        nvcc-threads = "MY_THREADS"
    """)
    env = recipe.env(_cell((90, 100)), max_jobs=4, nvcc_threads=2, local_version="v")
    assert env["MY_ARCHS"] == "sm_90,sm_100" and env["MY_THREADS"] == "2"
    assert recipe.supports_threads()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[knobs]\narchs = "X"', r"\[recipes.my-ext\] needs revision"),
        ('revision = "1"\nbuild-require = ["x"]',
         r"unknown key 'build-require' in \[recipes.my-ext\] \(did you mean 'build-requires'\?\)"),
        ('revision = "1"\n[knobs]\nforce-build = "TRUE"', r"force-build must be 'VARIABLE=VALUE'"),
        ('revision = "1"\n[knobs]\narchs = "MY ARCHS"', r"must be an environment variable name"),
        ('revision = "1"\n[knobs]\narch-format = "{cc}"', r"arch-format must use \{major\}"),
        ('revision = "1"\ndefault-archs = ["ten"]', r"default-archs: unparseable GPU arch"),
        ('revision = "1"\n[[fixes]]\nreason = "r"\nfile = "../x"\nreplace = "a"\nwith = "b"',
         r"file must be a path inside the source tree"),
        ('revision = "1"\n[[fixes]]\nreason = "r"\nfile = "x"\nreplace = "a"\nwith = "b"\n'
         'when = { torch = "2.14!" }', r"is not a version specifier"),
        ('revision = "1"\n[[fixes]]\nreason = "r"\nfile = "x"\nreplace = "a"\nwith = "b"\n'
         'when = { troch = ">=2" }', r"did you mean 'torch'"),
        ('revision = "1"\n[smoke-test]\nwith-dependencies = false',
         r"with-dependencies = false needs import"),
        ('revision = "1"\n[smoke-test]\nimport = ["not a module"]', r"is not a module name"),
        ('revision = "1"\npackage-archs = ["9.0"]', r"package-archs must be an array of tables"),
        ('revision = "1"\npackage-archs = [{ cuda = ">=12.8" }]',
         r"package-archs #1 needs archs"),
        ('revision = "1"\npackage-archs = [{ cuda = "12.8+", archs = ["9.0"] }]',
         r"package-archs #1 cuda: '12.8\+' is not a version specifier"),
        ('revision = "1"\npackage-archs = [{ cdua = ">=12.8", archs = ["9.0"] }]',
         r"did you mean 'cuda'"),
    ],
)
def test_bad_recipe_tables_are_one_line_errors(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _recipe(table)
    assert "\n" not in info.value.message


def test_unknown_recipe_gets_a_did_you_mean() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown recipe 'flash_attn' \(did you mean 'flash-attn'\?\)"
    ):
        get_recipe("flash_attn")


# -- a recipe declared only in a matrix: docs/RECIPES.md's worked example --------------------
PRIVATE_CELL = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
PINS = ("torch", "cuda", "archs", "python", "platform")


def _documented_snippets() -> tuple[str, str]:
    """The recipe table and the package table of docs/RECIPES.md's worked example."""
    text = (REPO / "docs" / "RECIPES.md").read_text()
    section = text.split("## Adding a private extension", 1)[1].split("\n## ", 1)[0]
    recipe, package = re.findall(r"```toml\n(.*?)```", section, re.S)
    return recipe, package


def _private_matrix(tmp_path: Path, *, pinned: bool = True) -> Path:
    """The documented snippets in a matrix with the default matrix's [axes] (its tracking
    rules); ``pinned`` False: the package table without its own axes."""
    from factory.tomlread import tomllib

    recipe, package = _documented_snippets()
    package = package.replace('"tests/example_ext"', json.dumps(str(REPO / "tests/example_ext")))
    if not pinned:
        package = "".join(ln for ln in package.splitlines(keepends=True)
                          if ln.split("=")[0].strip() not in PINS)
    axes = tomllib.loads((REPO / "matrix.toml").read_text())["axes"]
    path = tmp_path / "matrix.toml"
    path.write_text('version = 1\n[settings]\nstore = "store"\n[axes]\n'
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in axes.items())
                    + f"\n{recipe}\n{package}")
    return path


def test_the_documented_example_is_the_one_cell_the_docs_name(tmp_path: Path) -> None:
    (pc,) = load_matrix(_private_matrix(tmp_path)).cells
    assert pc.cell.id == PRIVATE_CELL
    assert f"this is one cell,\n`{PRIVATE_CELL}`" in (REPO / "docs" / "RECIPES.md").read_text()


def test_without_its_own_axes_the_example_takes_the_default_matrix_rules(tmp_path: Path) -> None:
    """What the docs say the package table's pins are for: the default [axes] track the newest
    two torch minors, every CUDA torch ships, three arch sets, every Python and both CPUs."""
    cells = [pc.cell for pc in load_matrix(_private_matrix(tmp_path, pinned=False)).cells]
    assert len(cells) >= 24, [c.id for c in cells]  # "dozens of builds"
    assert {c.archs for c in cells} == {(90,), (100,), (120,)}
    assert {c.platform for c in cells} == {"x86_64", "aarch64"}
    assert len({c.torch.rsplit(".", 1)[0] for c in cells}) == 2
    assert len({c.python for c in cells}) > 1 and len({c.cuda for c in cells}) > 1


def test_a_matrix_declares_a_recipe_of_its_own(tmp_path: Path) -> None:
    matrix = load_matrix(_private_matrix(tmp_path))
    (pc,) = matrix.cells
    assert pc.recipe.name == "team-ext" and pc.recipe.origin == str(tmp_path / "matrix.toml")
    assert pc.recipe.revision == "1"
    assert pc.content_key == pc.cell.content_key("1", manylinux=pc.manylinux)
    assert "team-ext" not in RECIPES  # the matrix's own, not registered for anyone else


def test_the_dry_run_of_a_matrix_recipe_shows_its_knobs(tmp_path: Path) -> None:
    """The bundled example built by a recipe declared only in a temporary matrix.toml: the dry
    run (the real CLI) shows its knobs, its fixed variables and the compiler wrappers."""
    proc = subprocess.run(
        [sys.executable, "-m", "factory", "build", PRIVATE_CELL, "--matrix",
         str(_private_matrix(tmp_path)),
         "--dry-run", "--json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (d,) = json.loads(proc.stdout)["dry_run"]
    assert d["env"]["TEAM_EXT_FORCE_BUILD"] == "1" and d["env"]["TEAM_EXT_FAST_MATH"] == "1"
    assert d["env"]["FACTORY_LOCAL_VERSION"] == "cu130torch2.14sm100"
    assert d["env"]["TORCH_CUDA_ARCH_LIST"] == "10.0"
    assert d["compilers"]["archs"] == [100] and d["compilers"]["cxx_std"] == 20
    assert ("the package's own list is unknown; nvcc will compile only sm_100"
            in d["compilers"]["applies"])
    assert "build>=1.2" in d["requirements"]
    assert d["runner"]["inside_job"]["compilers"]["dir"] == "/factory/run/toolkit"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[recipes.flash-attn]\nrevision = "1"\n', r"'flash-attn' is a shipped recipe"),
        ('[recipes.Team_Ext2]\nrevision = "1"\n', r"write the name as 'team-ext2'"),
        ('[recipes.team-ext2]\nbuild-requires = "setuptools"\nrevision = "1"\n',
         r"build-requires must be a list of strings"),
    ],
)
def test_bad_matrix_recipes_are_one_line_errors(tmp_path: Path, extra: str, message: str) -> None:
    path = _private_matrix(tmp_path)
    path.write_text(path.read_text() + extra)
    with pytest.raises(ConfigError, match=message):
        load_matrix(path)
