"""Recipes: how each package takes its build knobs, as data.

Each shipped recipe is one TOML file here (``flash-attn.toml``, ``torch-extension.toml``, ...);
a matrix may declare its own in the same form (``[recipes.NAME]``). ``factory.recipes.base``
reads them; the pipeline only calls the :class:`Recipe` interface, never package code.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

from packaging.utils import canonicalize_name

from factory.errors import ConfigError
from factory.recipes.base import Recipe, SourceFix, cxx_standard
from factory.tomlread import tomllib

SHIPPED_DIR = Path(__file__).parent


def _shipped() -> dict[str, Recipe]:
    out: dict[str, Recipe] = {}
    for path in sorted(SHIPPED_DIR.glob("*.toml")):
        name = path.stem
        with path.open("rb") as fh:
            table = tomllib.load(fh)
        out[name] = Recipe.from_table(name, table, where=f"recipe {path.name}", origin="shipped")
    return out


RECIPES: dict[str, Recipe] = _shipped()


def default_archs_for(project: str) -> tuple[int, ...] | None:
    """The arch set a wheel of this project holds when its tag names none: the default of the
    shipped recipe named like the project (flash-attn); None when no recipe is."""
    recipe = RECIPES.get(canonicalize_name(project))
    return recipe.default_archs if recipe else None


def recipe_for_project(project: str) -> Recipe | None:
    """The shipped recipe named like the project, if any (for a wheel checked without a matrix)."""
    return RECIPES.get(canonicalize_name(project))


def get_recipe(name: str, declared: Mapping[str, Recipe] | None = None) -> Recipe:
    """The recipe called ``name``: one the matrix declares (``declared``), else a shipped one."""
    known = {**RECIPES, **(declared or {})}
    try:
        return known[name]
    except KeyError:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown recipe {name!r}{hint}; known: {', '.join(sorted(known))}"
        ) from None


def declared_recipes(raw: object, *, origin: str) -> dict[str, Recipe]:
    """A matrix's ``[recipes.NAME]`` tables. A name may not shadow a shipped recipe: the same
    name would mean two things in two matrices."""
    if not isinstance(raw, dict):
        raise ConfigError("[recipes] must hold [recipes.NAME] tables")
    out: dict[str, Recipe] = {}
    for name, table in raw.items():
        where = f"[recipes.{name}]"
        if name != canonicalize_name(name):
            raise ConfigError(f"{where}: write the name as {canonicalize_name(name)!r} "
                              "(lower case, '-' between words)")
        if name in RECIPES:
            raise ConfigError(f"{where}: {name!r} is a shipped recipe; give yours another name")
        out[name] = Recipe.from_table(name, table, where=where, origin=origin)
    return out


__all__ = ["RECIPES", "Recipe", "SourceFix", "cxx_standard", "declared_recipes", "get_recipe"]
