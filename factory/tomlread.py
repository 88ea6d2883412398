"""TOML reading on every Python the project runs on: the standard library's ``tomllib`` from
3.11, its backport ``tomli`` (the same code, a declared dependency there) on 3.10, the
``python3`` of Ubuntu 22.04, where GPU hosts run ``factory doctor``."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised by the floor-Python test
    import tomli as tomllib

__all__ = ["tomllib"]
