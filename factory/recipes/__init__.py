"""Recipes: one module per package with special knobs, plus the generic torch extension.

Adding a package is adding a module here and a line in ``RECIPES``; the pipeline never changes.
"""

from __future__ import annotations

from factory.errors import ConfigError
from factory.recipes.base import Recipe, SourceFix
from factory.recipes.flash_attn import RECIPE as FLASH_ATTN
from factory.recipes.torch_extension import RECIPE as TORCH_EXTENSION

RECIPES: dict[str, Recipe] = {r.name: r for r in (FLASH_ATTN, TORCH_EXTENSION)}


def default_archs_for(project: str) -> tuple[int, ...] | None:
    """The arch set a wheel of this project holds when its tag names none: the default of the
    recipe named like the project (flash-attn); None when no recipe is."""
    from packaging.utils import canonicalize_name

    recipe = RECIPES.get(canonicalize_name(project))
    return recipe.default_archs if recipe else None


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, RECIPES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown recipe {name!r}{hint}; known: {', '.join(sorted(RECIPES))}"
        ) from None


__all__ = ["RECIPES", "Recipe", "SourceFix", "get_recipe"]
