"""The index: PEP 503/691 pages derived from the store, per variant and combined."""

from __future__ import annotations

from factory.index.verify import VerifyReport, verify_index
from factory.index.writer import RebuildReport, rebuild_index, update_index

__all__ = ["RebuildReport", "VerifyReport", "rebuild_index", "update_index", "verify_index"]
