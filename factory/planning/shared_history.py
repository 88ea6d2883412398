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
import dataclasses
import datetime
import json
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from factory.errors import FactoryError, StoreError
from factory.matrix.cell import Cell
from factory.planning.memory_model import BuildMeasurement, MemoryHistory
from factory.planning.object_times import RecordedRun

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
        "source": m.source, "run": m.run.as_dict() if m.run else None,
    }


def measurement_of(doc: object) -> BuildMeasurement:
    """A record read back, checked as untrusted input: anything else than a record this
    module writes (another JSON type, a field of the wrong type, a cell that does not parse, a
    number no build measures) is a StoreError naming what is wrong."""
    try:
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        if doc.get("version") != RECORD_VERSION:
            raise ValueError(f"unknown record version {doc.get('version')!r}")
        c = doc["cell"]
        if not isinstance(c, dict):
            raise TypeError("'cell' is not an object")
        archs = c["archs"]
        if not isinstance(archs, list) or not all(_is_int(a) for a in archs):
            raise TypeError("'archs' is not a list of numbers")
        cell = Cell(package=_text(c, "package"), version=_text(c, "version"),
                    torch=_text(c, "torch"), cuda=_text(c, "cuda"), archs=tuple(archs),
                    python=_text(c, "python"))
        peak = doc.get("peak_job_bytes")
        return BuildMeasurement(
            cell=cell, nvcc_threads=_count(doc["nvcc_threads"], "nvcc_threads", 1, 1024),
            max_jobs=_count(doc["max_jobs"], "max_jobs", 1, 65536),
            cpus=_count(doc.get("cpus", 0), "cpus", 0, 65536),
            peak_job_bytes=None if peak is None else _count(peak, "peak_job_bytes", 0, _MAX_BYTES),
            object_seconds={str(k): _seconds(v) for k, v in _table(doc, "object_seconds")},
            object_peaks={str(k): _count(v, "an object peak", 0, _MAX_BYTES)
                          for k, v in _table(doc, "object_peaks")},
            source=str(doc.get("source", "")),
            run=RecordedRun.from_dict(doc["run"]) if doc.get("run") else None,
        )
    except (KeyError, TypeError, ValueError, FactoryError) as exc:
        what = exc.message if isinstance(exc, FactoryError) else str(exc)
        if isinstance(exc, KeyError):
            what = f"no {exc}"
        raise StoreError(f"corrupt history record: {what}") from None


_MAX_BYTES = 2**40  # 1 TiB: more than any compile job's peak
_MAX_SECONDS = 30 * 86400.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(doc: dict[str, Any], name: str) -> str:
    value = doc[name]
    if not isinstance(value, str):
        raise TypeError(f"{name!r} is not a string")
    return value


def _count(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} {str(value)[:40]!r} is not a whole number in {low}..{high}")
    return value


def _seconds(value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not 0 <= value <= _MAX_SECONDS:
        raise ValueError(f"object seconds {str(value)[:40]!r} are not 0..{_MAX_SECONDS:.0f}")
    return float(value)


def _table(doc: dict[str, Any], name: str) -> list[tuple[str, object]]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise TypeError(f"{name!r} is not an object")
    return list(value.items())


def push(store: RecordStore, m: BuildMeasurement) -> str:
    """Write one measurement as a new record; returns its key."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    key = f"{RECORDS_PREFIX}{stamp}-{uuid.uuid4().hex[:12]}.json"
    data = json.dumps(record_document(m), sort_keys=True).encode()
    if not store.put_new(key, data):
        raise StoreError(f"history record {key} already exists")
    return key


@dataclasses.dataclass(frozen=True, kw_only=True)
class BadRecord:
    key: str
    problem: str


def read_records(store: RecordStore) -> tuple[list[BuildMeasurement], list[BadRecord]]:
    """Every record in the store, oldest first, and the ones that are not records (each with
    why): read from a shared store, they are untrusted input."""
    keys = sorted(o.key for o in store.list(RECORDS_PREFIX, sizes=False))
    good: list[BuildMeasurement] = []
    bad: list[BadRecord] = []
    for key, data in zip(keys, store.read_many(keys), strict=True):
        if data is None:
            continue  # removed since the listing
        try:
            good.append(measurement_of(json.loads(data)))
        except ValueError:  # not JSON (UnicodeDecodeError included)
            bad.append(BadRecord(key=key, problem="corrupt history record: not JSON"))
        except StoreError as exc:
            bad.append(BadRecord(key=key, problem=exc.message))
    return good, bad


def merge_into(history: MemoryHistory, store: RecordStore,
               skipped: list[BadRecord] | None = None) -> int:
    """Fold every record in the store into ``history`` (in memory), oldest first; returns
    how many. A corrupt record is skipped, never fatal: a plan matters more. ``skipped``
    collects them."""
    good, bad = read_records(store)
    folded = 0
    for m in good:
        history.fold(m)
        folded += 1
    if skipped is not None:
        skipped.extend(bad)
    return folded
