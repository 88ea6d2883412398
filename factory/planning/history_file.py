"""The memory history as a file: where it is, how it is read and checked, how it is written.

One JSON document, ``"version": 1``, with ``defaults`` (per recipe), ``memory`` (per-job
peaks per key) and ``objects`` (per-object times and peaks, and the runs they come from).
The project ships one (``factory/data/memory_history.json``); ``FACTORY_MEMORY_HISTORY`` or a
path points at another, which overlays it. Writes are atomic (temp file + os.replace).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.resources
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from factory.environment import HISTORY_ENV
from factory.errors import ConfigError

HISTORY_VERSION = 1


def shipped_history_path() -> Path:
    return Path(str(importlib.resources.files("factory.data").joinpath("memory_history.json")))


def history_path(path: Path | str | None = None) -> Path:
    """Explicit path, else $FACTORY_MEMORY_HISTORY, else the shipped defaults."""
    if path:
        return Path(path)
    env = os.environ.get(HISTORY_ENV)
    return Path(env) if env else shipped_history_path()


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def empty_document() -> dict[str, Any]:
    return {"version": HISTORY_VERSION, "defaults": {}, "memory": [], "objects": []}


def read_document(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read memory history {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"memory history {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"memory history {path} must be a JSON object")
    return data


def checked(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The document's version and the types of its three tables (records are checked by
    their reader)."""
    if doc.get("version") != HISTORY_VERSION:
        raise ConfigError(
            f"{where}: memory history version {doc.get('version')!r} is not supported (only 1)"
        )
    out = dict(doc)
    for field in ("memory", "objects"):
        if not isinstance(out.setdefault(field, []), list):
            raise ConfigError(f"{where}: {field!r} must be a list")
    if not isinstance(out.setdefault("defaults", {}), dict):
        raise ConfigError(f"{where}: 'defaults' must be an object")
    return out


def atomic_write_json(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
