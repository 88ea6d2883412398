"""The generic recipe: any setuptools torch CUDA extension that honours TORCH_CUDA_ARCH_LIST."""

from __future__ import annotations

import dataclasses

from factory.matrix.cell import Cell
from factory.recipes.base import Recipe


@dataclasses.dataclass(frozen=True, kw_only=True)
class TorchExtensionRecipe(Recipe):
    def env(self, cell: Cell, *, max_jobs: int, nvcc_threads: int,
            local_version: str) -> dict[str, str]:
        return {
            # Code for exactly these archs, no PTX: '+PTX' would put JIT code in the wheel.
            "TORCH_CUDA_ARCH_LIST": cell.arch_list,
            "MAX_JOBS": str(max_jobs),
            "FACTORY_LOCAL_VERSION": local_version,
        }


RECIPE = TorchExtensionRecipe(
    name="torch-extension",
    revision="1",
    default_archs=None,
    supported_archs=None,
    build_requires=("setuptools", "wheel", "ninja", "packaging"),
    memory_model_key="torch-extension",
)
