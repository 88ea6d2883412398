"""Memory and time history shared by builders through the store: merged, never overwritten.

Every finished build writes its measurement as a new object of its own,
``history/records/<UTC stamp>-<random>.json``, with an exclusive create (S3 ``IfNoneMatch``,
the local store's exclusive write). Nothing is ever rewritten, so concurrent builders cannot
lose each other's records; a reader lists them and folds them, oldest first, into its own
history (the shipped defaults and the builder's file), exactly as its own builds would have
(peaks: the largest recent ones; per-object peaks: the largest seen; times: the latest).
"""

from __future__ import annotations

import builtins
import datetime
import json
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from factory.errors import StoreError
from factory.matrix.cell import Cell
from factory.planning.memory_model import BuildMeasurement, MemoryHistory

RECORDS_PREFIX = "history/records/"
RECORD_VERSION = 1


class _Listed(Protocol):
    @property
    def key(self) -> str: ...


class RecordStore(Protocol):
    """The primitives of factory.store's Store the records need (no import: the store
    is a later stage)."""

    def put_new(self, key: str, data: bytes) -> bool: ...

    def list(self, prefix: str, *, sizes: bool = True) -> Iterator[_Listed]: ...

    def read_many(self, keys: builtins.list[str]) -> builtins.list[bytes | None]: ...


def record_document(m: BuildMeasurement) -> dict[str, Any]:
    return {
        "version": RECORD_VERSION, "cell": m.cell.as_dict(), "nvcc_threads": m.nvcc_threads,
        "max_jobs": m.max_jobs, "cpus": m.cpus, "peak_job_bytes": m.peak_job_bytes,
        "object_seconds": dict(m.object_seconds), "object_peaks": dict(m.object_peaks),
        "source": m.source,
    }


def measurement_of(doc: dict[str, Any]) -> BuildMeasurement:
    try:
        if doc.get("version") != RECORD_VERSION:
            raise ValueError(f"unknown record version {doc.get('version')!r}")
        c = doc["cell"]
        cell = Cell(package=c["package"], version=c["version"], torch=c["torch"],
                    cuda=c["cuda"], archs=tuple(c["archs"]), python=c["python"])
        return BuildMeasurement(
            cell=cell, nvcc_threads=int(doc["nvcc_threads"]), max_jobs=int(doc["max_jobs"]),
            cpus=int(doc.get("cpus", 0)), peak_job_bytes=doc.get("peak_job_bytes"),
            object_seconds={str(k): float(v) for k, v in doc.get("object_seconds", {}).items()},
            object_peaks={str(k): int(v) for k, v in doc.get("object_peaks", {}).items()},
            source=str(doc.get("source", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"corrupt history record: {exc}") from None


def push(store: RecordStore, m: BuildMeasurement) -> str:
    """Write one measurement as a new record; returns its key."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    key = f"{RECORDS_PREFIX}{stamp}-{uuid.uuid4().hex[:12]}.json"
    data = json.dumps(record_document(m), sort_keys=True).encode()
    if not store.put_new(key, data):
        raise StoreError(f"history record {key} already exists")
    return key


def merge_into(history: MemoryHistory, store: RecordStore) -> int:
    """Fold every record in the store into ``history`` (in memory), oldest first; returns
    how many. A corrupt record is skipped, never fatal: a plan matters more."""
    keys = sorted(o.key for o in store.list(RECORDS_PREFIX, sizes=False))
    folded = 0
    for data in store.read_many(keys):
        if data is None:
            continue
        try:
            history.fold(measurement_of(json.loads(data)))
        except (StoreError, ValueError):
            continue
        folded += 1
    return folded
