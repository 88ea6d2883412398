"""The matrix's index tables: ``[indexes]`` (where the facts are read) and ``[torch-indexes]``
(a mirror of a per-CUDA torch index, CUDA version = URL)."""

from __future__ import annotations

import os
from typing import Any

from factory.errors import CellError, ConfigError
from factory.matrix.cell import parse_cuda
from factory.matrix.settings import check_keys
from factory.upstream.read import Indexes


def indexes_table(raw: Any) -> Indexes:
    """``[indexes]``: where the facts are read. ``pypi``: PyPI's simple API or a mirror (default
    $PIP_INDEX_URL, else PyPI); ``pytorch``: the one pattern of PyTorch's per-CUDA indexes."""
    if not isinstance(raw, dict):
        raise ConfigError("[indexes] must be a table (pypi = URL, pytorch = URL pattern)")
    check_keys(raw, {"pypi", "pytorch"}, "[indexes]")
    pypi = raw.get("pypi") or os.environ.get("PIP_INDEX_URL") or Indexes().pypi
    pattern = raw.get("pytorch", Indexes().pytorch)
    for key, value in (("pypi", pypi), ("pytorch", pattern)):
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            raise ConfigError(f"[indexes] {key} must be an http(s) URL")
    if "{cuda_tag}" not in pattern and "{cuda}" not in pattern:
        raise ConfigError("[indexes] pytorch must name the CUDA: a pattern with {cuda_tag} "
                          "(cu130) or {cuda} (13.0)")
    return Indexes(pypi=pypi, pytorch=pattern)


def torch_indexes_table(raw: Any) -> dict[str, str]:
    """``[torch-indexes]``: CUDA version = the PyTorch index URL for its torch builds."""
    if not isinstance(raw, dict):
        raise ConfigError("[torch-indexes] must be a table of CUDA version = URL")
    for k, v in raw.items():
        try:
            parse_cuda(k)
        except CellError as exc:
            raise ConfigError(f"[torch-indexes]: {exc.message}") from None
        if not isinstance(v, str) or not v.startswith(("http://", "https://", "file://")):
            raise ConfigError(f"[torch-indexes] {k!r} must be an http(s) or file URL")
    return dict(raw)
