"""The index: PEP 503/691 pages derived from the store, per variant and combined."""

from __future__ import annotations

from factory.index.publish import rebuild_index
from factory.index.verify import IndexReport, verify_index
from factory.index.writer import RebuildReport, update_index

__all__ = ["IndexReport", "RebuildReport", "rebuild_index", "update_index", "verify_index"]
