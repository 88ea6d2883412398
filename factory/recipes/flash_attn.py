"""flash-attn 2.x: its own arch variable, nvcc threads, forced source build, local version."""

from __future__ import annotations

import dataclasses

from factory.matrix.cell import Cell, sm_list
from factory.recipes.base import Recipe, SourceFix


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlashAttnRecipe(Recipe):
    def supports_threads(self) -> bool:
        return True

    def env(self, cell: Cell, *, max_jobs: int, nvcc_threads: int,
            local_version: str) -> dict[str, str]:
        return {
            # setup.py reads this and passes its own -gencode flags; torch then drops
            # TORCH_CUDA_ARCH_LIST, so setting that one alone silently builds all four archs.
            "FLASH_ATTN_CUDA_ARCHS": sm_list(cell.archs),
            "MAX_JOBS": str(max_jobs),
            "NVCC_THREADS": str(nvcc_threads),
            # Never download upstream's prebuilt wheel from inside setup.py.
            "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
            "FLASH_ATTN_LOCAL_VERSION": local_version,
            # Torch's builder needs a list when no GPU is visible; flash-attn ignores it.
            "TORCH_CUDA_ARCH_LIST": cell.arch_list,
        }


RECIPE = FlashAttnRecipe(
    name="flash-attn",
    revision="1",
    default_archs=(80, 90, 100, 120),
    supported_archs=frozenset({80, 90, 100, 120}),
    build_requires=("setuptools", "wheel", "ninja", "packaging", "psutil", "einops"),
    fixes=(
        SourceFix(
            reason="torch >= 2.14 headers need C++20 (std::strong_ordering in intrusive_ptr.h)",
            file="setup.py",
            replace='"-std=c++17"',
            with_='"-std=c++20"',
            when={"torch": ">=2.14", "version": "<2.9"},
        ),
    ),
    memory_model_key="flash-attn",
)
