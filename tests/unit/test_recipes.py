"""Recipes: how each package takes its knobs, and its known fixes as data."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.matrix.cell import Cell
from factory.errors import BuildError, ConfigError
from factory.recipes import RECIPES, get_recipe

FLASH = get_recipe("flash-attn")
GENERIC = get_recipe("torch-extension")
CXX20 = "torch >= 2.14 headers need C++20 (std::strong_ordering in intrusive_ptr.h)"


def _cell(
    archs: tuple[int, ...] = (100,), torch: str = "2.14.1", version: str = "2.8.3.post2"
) -> Cell:
    return Cell(
        package="flash-attn", version=version, torch=torch, cuda="13.0", archs=archs, python="3.11"
    )


def test_flash_attn_env_for_sm100() -> None:
    env = FLASH.env(_cell(), max_jobs=3, nvcc_threads=2, local_version="cu130torch2.14sm100")
    assert env == {
        "FLASH_ATTN_CUDA_ARCHS": "100",
        "MAX_JOBS": "3",
        "NVCC_THREADS": "2",
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
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


@pytest.mark.parametrize(
    ("torch", "version", "applies"),
    [
        ("2.14.1", "2.8.3.post2", True),
        ("2.14.0", "2.8.3", True),
        ("2.15.0", "2.8.3.post2", True),
        ("2.13.0", "2.8.3.post2", False),
        ("2.10.0", "2.8.3.post2", False),
        ("2.14.1", "2.9.0", False),  # a flash-attn that already builds with C++20
    ],
)
def test_cxx20_fix_applies_for_torch_2_14_and_later(
    torch: str, version: str, applies: bool
) -> None:
    reasons = [f.reason for f in FLASH.fixes_for(_cell(torch=torch, version=version))]
    assert (CXX20 in reasons) is applies


def test_the_cxx20_fix_edits_the_source_once(tmp_path: Path) -> None:
    (fix,) = FLASH.fixes_for(_cell())
    setup = tmp_path / fix.file
    setup.write_text(
        'cxx = ["-O3", "-std=c++17"]\nnvcc = ["-O3", "-std=c++17", "--use_fast_math"]\n'
    )
    assert fix.apply(tmp_path) is True
    assert (
        setup.read_text()
        == 'cxx = ["-O3", "-std=c++20"]\nnvcc = ["-O3", "-std=c++20", "--use_fast_math"]\n'
    )
    assert fix.apply(tmp_path) is False, "a resumed build tree is already fixed"


def test_a_fix_whose_text_is_gone_is_a_build_error(tmp_path: Path) -> None:
    (fix,) = FLASH.fixes_for(_cell())
    (tmp_path / fix.file).write_text("nothing to replace here\n")
    with pytest.raises(BuildError, match="the recipe needs updating"):
        fix.apply(tmp_path)


def test_generic_recipe_env_has_exact_archs_and_no_ptx() -> None:
    cell = Cell(
        package="demo", version="1.0", torch="2.14.1", cuda="13.0", archs=(90, 100), python="3.11"
    )
    env = GENERIC.env(cell, max_jobs=2, nvcc_threads=4, local_version="cu130torch2.14sm90.100")
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0;10.0"
    assert "PTX" not in env["TORCH_CUDA_ARCH_LIST"]
    assert env["MAX_JOBS"] == "2"
    assert "FLASH_ATTN_CUDA_ARCHS" not in env


def test_flash_attn_refuses_archs_it_does_not_build() -> None:
    with pytest.raises(ConfigError, match="cannot build arch"):
        FLASH.check_cell(_cell((86,)))
    FLASH.check_cell(_cell((80, 90, 100, 120)))
    GENERIC.check_cell(_cell((86,)))  # any arch nvcc knows


def test_unknown_recipe_gets_a_did_you_mean() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown recipe 'flash_attn' \(did you mean 'flash-attn'\?\)"
    ):
        get_recipe("flash_attn")


def test_recipes_are_registered_under_their_names() -> None:
    assert set(RECIPES) == {"flash-attn", "torch-extension"}
    for name, recipe in RECIPES.items():
        assert recipe.name == name and recipe.revision
